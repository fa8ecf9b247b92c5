package fetch

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

func TestResolve(t *testing.T) {
	f := newFixture(t)
	amdImg, err := f.idx.Image(mustHash(t, f.amd))
	if err != nil {
		t.Fatal(err)
	}
	armImg, err := f.idx.Image(mustHash(t, f.arm))
	if err != nil {
		t.Fatal(err)
	}
	// A docker archive written by a real client, not by go-containerregistry.
	skopeoArchive := filepath.Join(t.TempDir(), "skopeo.tar")
	if out, err := exec.Command("skopeo", "copy", "oci:"+f.ociDir+":quay.io/kiln/hello:1.0",
		"docker-archive:"+skopeoArchive+":quay.io/kiln/hello:1.0").CombinedOutput(); err != nil {
		t.Fatalf("skopeo copy: %v\n%s", err, out)
	}
	parent := filepath.Dir(f.ociDir)

	for _, tc := range []struct {
		name, source, base string
		platform           v1.Platform
		digest, index      string
		size               int64
	}{
		{"docker single", "docker://" + f.reg.host + "/kiln/hello:1.0", "", amd64, f.single, "", sizeOf(t, f.img)},
		{"docker index amd64", "docker://" + f.reg.host + "/kiln/hello:multi", "", amd64, f.amd, f.index, sizeOf(t, amdImg)},
		{"docker index arm64", "docker://" + f.reg.host + "/kiln/hello:multi", "", arm64, f.arm, f.index, sizeOf(t, armImg)},
		{"docker by digest", "docker://" + f.reg.host + "/kiln/hello@" + f.index, "", arm64, f.arm, f.index, sizeOf(t, armImg)},
		{"oci full ref", "oci:" + f.ociDir + ":quay.io/kiln/hello:1.0", "", amd64, f.single, "", sizeOf(t, f.img)},
		{"oci tag part", "oci:" + f.ociDir + ":1.0", "", amd64, f.single, "", sizeOf(t, f.img)},
		{"oci entry per platform", "oci:" + f.ociDir + ":split", "", arm64, f.arm, "", sizeOf(t, armImg)},
		{"oci relative", "oci:oci:multi", parent, arm64, f.arm, f.index, sizeOf(t, armImg)},
		{"docker-archive", "docker-archive:" + f.archive, "", amd64, f.archived, "", 0},
		{"docker-archive ref", "docker-archive:hello.tar:quay.io/kiln/hello:1.0", parent, amd64, f.archived, "", 0},
		{"docker-archive by skopeo", "docker-archive:" + skopeoArchive, "", amd64, "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Resolve(context.Background(), tc.source, tc.base, tc.platform)
			if err != nil {
				t.Fatal(err)
			}
			if tc.digest != "" && res.Digest != tc.digest {
				t.Errorf("digest = %s, want %s", res.Digest, tc.digest)
			}
			if res.IndexDigest != tc.index {
				t.Errorf("index digest = %q, want %q", res.IndexDigest, tc.index)
			}
			if tc.size != 0 && res.Size != tc.size {
				t.Errorf("size = %d, want %d", res.Size, tc.size)
			}
			if res.Source != tc.source || res.MediaType == "" || res.Size < 1<<20 {
				t.Errorf("resolved %+v", res)
			}
			// What Resolve locks, Fetch can fetch.
			c, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			img, err := c.Fetch(context.Background(), tc.source, tc.base, res.Digest, tc.platform, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkCached(t, c, img)
			if got := int64(len(img.Manifest)) + img.Config.Size + sumSizes(img.Layers); got != res.Size {
				t.Errorf("fetched %d bytes, resolved size %d", got, res.Size)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	f := newFixture(t)
	authReg := newRegistry(t)
	authReg.wrap = basicAuth
	authReg.push(t, "kiln/hello:1.0", f.img, testCreds)
	// No credentials anywhere the default keychain looks.
	empty := t.TempDir()
	t.Setenv("DOCKER_CONFIG", empty)
	t.Setenv("REGISTRY_AUTH_FILE", filepath.Join(empty, "auth.json"))
	t.Setenv("XDG_RUNTIME_DIR", empty)
	t.Setenv("XDG_CONFIG_HOME", empty)

	notLayout := t.TempDir()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	two := filepath.Join(t.TempDir(), "two.tar")
	armImg, err := f.idx.Image(mustHash(t, f.arm))
	if err != nil {
		t.Fatal(err)
	}
	tagA, _ := name.NewTag("quay.io/kiln/a:1")
	tagB, _ := name.NewTag("quay.io/kiln/b:1")
	if err := tarball.MultiWriteToFile(two, map[name.Tag]v1.Image{tagA: f.img, tagB: armImg}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, source string
		platform     v1.Platform
		kind         error
		says         []string
	}{
		{"no transport", "quay.io/kiln/hello:1.0", amd64, ErrBadSource, []string{"write docker://quay.io/kiln/hello:1.0 for a registry"}},
		{"unknown transport", "ftp:x", amd64, ErrBadSource, []string{"unknown transport"}},
		{"missing tag", "docker://" + f.reg.host + "/kiln/hello:2.0", amd64, ErrNotFound, []string{"hello:2.0", "tag"}},
		{"missing repo", "docker://" + f.reg.host + "/kiln/nope:1.0", amd64, ErrNotFound, []string{"nope", "repository"}},
		{"unreachable", "docker://127.0.0.1:1/kiln/hello:1.0", amd64, ErrUnreachable, []string{"127.0.0.1:1", "oci:DIR"}},
		{"auth", "docker://" + authReg.host + "/kiln/hello:1.0", amd64, ErrAuth, []string{authReg.host, "skopeo login " + authReg.host, "docker login"}},
		{"index without platform", "docker://" + f.reg.host + "/kiln/hello:multi", images.Platform("s390x"), ErrPlatform, []string{"linux/s390x", "linux/amd64, linux/arm64"}},
		{"image of another arch", "docker://" + f.reg.host + "/kiln/hello:1.0", arm64, ErrPlatform, []string{"linux/arm64", "it has: linux/amd64"}},
		{"oci platform", "oci:" + f.ociDir + ":multi", images.Platform("riscv64"), ErrPlatform, []string{"linux/riscv64", "linux/amd64, linux/arm64"}},
		{"oci entry per platform", "oci:" + f.ociDir + ":split", images.Platform("s390x"), ErrPlatform, []string{"linux/s390x", "linux/amd64, linux/arm64"}},
		{"oci dir missing", "oci:" + filepath.Join(notLayout, "nope") + ":1.0", amd64, ErrBadSource, []string{"does not exist"}},
		{"oci not a layout", "oci:" + notLayout + ":1.0", amd64, ErrBadSource, []string{"not an OCI image layout", "skopeo copy"}},
		{"oci is a file", "oci:" + file, amd64, ErrBadSource, []string{"docker-archive:"}},
		{"oci tag missing", "oci:" + f.ociDir + ":2.0", amd64, ErrNotFound, []string{`"2.0"`, `"quay.io/kiln/hello:1.0"`, `"quay.io/kiln/hello:multi"`}},
		{"oci which image", "oci:" + f.ociDir, amd64, ErrBadSource, []string{"holds 4 images", "e.g. source: oci:" + f.ociDir + ":quay.io/kiln/hello:1.0"}},
		{"archive missing", "docker-archive:" + filepath.Join(notLayout, "x.tar"), amd64, ErrBadSource, []string{"x.tar"}},
		{"archive not an archive", "docker-archive:" + file, amd64, ErrBadSource, []string{"docker save"}},
		{"archive which image", "docker-archive:" + two, amd64, ErrBadSource, []string{"holds 2 images", "quay.io/kiln/a:1", "e.g. source: docker-archive:" + two + ":quay.io/kiln/a:1"}},
		{"archive ref missing", "docker-archive:" + f.archive + ":quay.io/kiln/other:1", amd64, ErrNotFound, []string{"kiln/other", "quay.io/kiln/hello:1.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(context.Background(), tc.source, "", tc.platform)
			t.Log(err)
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err = %v, want %v", err, tc.kind)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q: %v", s, err)
				}
			}
		})
	}
}

// TestResolveAuth logs in the way a technician would: credentials in a
// docker config file that the default keychain reads.
func TestResolveAuth(t *testing.T) {
	reg := newRegistry(t)
	reg.wrap = basicAuth
	reg.push(t, "kiln/hello:1.0", mustHello(t), testCreds)
	dir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", dir)
	cfg := `{"auths":{"` + reg.host + `":{"auth":"a2lsbjpzZWNyZXQ="}}}` // kiln:secret
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := Resolve(context.Background(), "docker://"+reg.host+"/kiln/hello:1.0", "", amd64)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fetch(context.Background(), res.Source, "", res.Digest, amd64, nil); err != nil {
		t.Fatal(err)
	}
}

func mustHash(t *testing.T, s string) v1.Hash {
	t.Helper()
	h, err := v1.NewHash(s)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func mustHello(t *testing.T) v1.Image {
	t.Helper()
	img, err := images.Hello("amd64")
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func sumSizes(ds []v1.Descriptor) int64 {
	var n int64
	for _, d := range ds {
		n += d.Size
	}
	return n
}
