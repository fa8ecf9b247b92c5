package regindex

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

const hexDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParseName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in                string
		repo, tag, digest string
		err               string // substring; "" = no error
	}{
		{in: "quay.io/acme/app:1.2", repo: "quay.io/acme/app", tag: "1.2"},
		{in: "quay.io/acme/app@" + hexDigest, repo: "quay.io/acme/app", digest: hexDigest},
		{in: "registry.local:5000/team/app:v1", repo: "registry.local:5000/team/app", tag: "v1"},
		{in: "busybox:1.36", repo: "docker.io/library/busybox", tag: "1.36"},
		{in: "docker.io/busybox:1.36", repo: "docker.io/library/busybox", tag: "1.36"},
		{in: "index.docker.io/library/busybox:1.36", repo: "docker.io/library/busybox", tag: "1.36"},
		{in: "acme/app:2", repo: "docker.io/acme/app", tag: "2"},
		{in: "latest", err: "not a full image reference"},
		{in: "1.2", err: "not a full image reference"},
		{in: "quay.io/acme/app", err: "not a full image reference"},
		{in: "registry.local:5000/app", err: "not a full image reference"},
		{in: "", err: "not a full image reference"},
		{in: "quay.io/acme/App:1", err: "must be lowercase"},
		{in: "quay.io/../etc:1", err: "invalid reference format"},
		{in: "quay.io/acme/app:-x", err: "invalid reference format"},
		{in: "quay.io/acme/app@sha256:abc", err: "invalid reference format"},
		{in: "quay.io/acme/app@sha512:" + strings.Repeat("a", 128), err: "digest"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			repo, tag, digest, err := ParseName(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseName(%q) error %v, want one containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseName(%q): %v", tc.in, err)
			}
			if repo != tc.repo || tag != tc.tag || digest != tc.digest {
				t.Errorf("ParseName(%q) = %q %q %q, want %q %q %q", tc.in, repo, tag, digest, tc.repo, tc.tag, tc.digest)
			}
		})
	}
	if _, _, _, err := ParseName("latest"); !errors.Is(err, ErrNotFullReference) {
		t.Errorf("bare tag: error %v is not ErrNotFullReference", err)
	}
}

// staysInside reports whether joining name under a layout root can only
// address something inside it.
func staysInside(name string) bool {
	root := "/layout"
	p := filepath.Join(root, name)
	return strings.HasPrefix(p, root+"/") && !strings.ContainsAny(name, "\\\x00%") && !strings.Contains("/"+name+"/", "/../")
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"quay.io/acme/app:1.2", "busybox:1.36", "quay.io/a@" + hexDigest, "latest",
		"localhost:5000/a/b:c", "quay.io/../x:1", "a/b/c/d/e:f", "::", "@", "x@sha256:", "[::1]:5000/a:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		repo, tag, digest, err := ParseName(in)
		if err != nil {
			return
		}
		if ValidName(repo) != nil || !staysInside(repo) {
			t.Fatalf("ParseName(%q) gave unusable repository %q", in, repo)
		}
		if (tag == "") == (digest == "") {
			t.Fatalf("ParseName(%q): want exactly one of tag %q, digest %q", in, tag, digest)
		}
		if tag != "" && !ValidTag(tag) || digest != "" && !ValidDigest(digest) {
			t.Fatalf("ParseName(%q): invalid tag %q or digest %q", in, tag, digest)
		}
	})
}
