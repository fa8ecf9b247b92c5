package fetch

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestFetchChecksLockAgainstSource: a locked digest that is not what the
// source has for the name fails as the lock's fault, naming both digests
// (and the other image, when the digest is one), never as a damaged or
// incomplete copy, and never builds the other image under this name.
func TestFetchChecksLockAgainstSource(t *testing.T) {
	f := newFixture(t)
	random := "sha256:" + strings.Repeat("5e", 32)
	for _, tc := range []struct {
		name, source, digest string
		says                 []string
	}{
		{"another image's digest, layout", "oci:" + f.ociDir + ":1.0", f.index,
			[]string{"the lock's digest " + f.index + " is the image quay.io/kiln/hello:multi in that source", f.single}},
		{"another image's platform manifest, layout", "oci:" + f.ociDir + ":1.0", f.arm,
			[]string{f.arm + " is the image quay.io/kiln/hello:multi", f.single}},
		{"digest the layout lacks", "oci:" + f.ociDir + ":1.0", random,
			[]string{"the lock says " + random, "the source has " + f.single}},
		{"another tag's digest, registry", "docker://" + f.reg.host + "/kiln/hello:1.0", f.index,
			[]string{"the lock says " + f.index, "the source has " + f.single}},
		{"digest the registry lacks", "docker://" + f.reg.host + "/kiln/hello:1.0", random,
			[]string{"the lock says " + random, "the source has " + f.single}},
		{"digest the archive lacks", "docker-archive:" + f.archive, random,
			[]string{"the lock says " + random, "the source has " + f.archived}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.FetchAll(context.Background(), []Request{{Name: "quay.io/acme/app:1.2", Source: tc.source, Digest: tc.digest, Platform: amd64}}, nil)
			if !errors.Is(err, ErrLockMismatch) {
				t.Fatalf("err = %v, want ErrLockMismatch", err)
			}
			for _, s := range append(tc.says, "image quay.io/acme/app:1.2:", "--refresh-lock") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q:\n%v", s, err)
				}
			}
			if strings.Contains(err.Error(), "incomplete") {
				t.Errorf("blames the copy: %v", err)
			}
		})
	}
}
