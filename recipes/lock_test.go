package recipes

import (
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const (
	digestA = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	digestB = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	digestI = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	ociType = "application/vnd.oci.image.manifest.v1+json"
)

func TestLockPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"demo.yaml":          "demo.lock",
		"recipes/demo.yml":   "recipes/demo.lock",
		"/srv/a.b/edge.yaml": "/srv/a.b/edge.lock",
		"noext":              "noext.lock",
		"odd.json":           "odd.json.lock",
	} {
		if got := LockPath(in); got != want {
			t.Errorf("LockPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// lockRecipe has a plain image, one with an oci source, and one pinned by
// digest; testLock is its fresh lock.
func lockRecipe(t *testing.T) *Recipe {
	t.Helper()
	r, err := Parse("demo.yaml", []byte(head+`images:
  - name: quay.io/acme/app:1.2
  - name: quay.io/acme/db:3
    source: oci:layouts/db:3
  - name: quay.io/acme/agent@`+digestI+`
`))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func testLock(r *Recipe) *Lock {
	return NewLock(r, []LockedImage{
		{Name: "quay.io/acme/app:1.2", Source: "docker://quay.io/acme/app:1.2", Digest: digestA, IndexDigest: digestI, MediaType: ociType, Size: 1234},
		{Name: "quay.io/acme/db:3", Source: "oci:layouts/db:3", Digest: digestB, MediaType: "application/vnd.docker.distribution.manifest.v2+json", Size: 99},
		{Name: "quay.io/acme/agent@" + digestI, Source: "docker://quay.io/acme/agent@" + digestI, Digest: digestA, IndexDigest: digestI, MediaType: ociType, Size: 5},
	})
}

func TestLockRoundTrip(t *testing.T) {
	t.Parallel()
	r := lockRecipe(t)
	l := testLock(r)
	data, err := l.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := "# Written by `kiln lock`; do not edit. Run `kiln lock RECIPE` to refresh it.\n" + `apiVersion: kiln.dev/v1alpha1
kind: Lock
inputs: ` + r.LockInputs() + `
platform: linux/amd64
images:
  - name: quay.io/acme/app:1.2
    source: docker://quay.io/acme/app:1.2
    digest: ` + digestA + `
    indexDigest: ` + digestI + `
    mediaType: application/vnd.oci.image.manifest.v1+json
    size: 1234
  - name: quay.io/acme/db:3
    source: oci:layouts/db:3
    digest: ` + digestB + `
    mediaType: application/vnd.docker.distribution.manifest.v2+json
    size: 99
  - name: quay.io/acme/agent@` + digestI + `
    source: docker://quay.io/acme/agent@` + digestI + `
    digest: ` + digestA + `
    indexDigest: ` + digestI + `
    mediaType: application/vnd.oci.image.manifest.v1+json
    size: 5
`
	if string(data) != want {
		t.Errorf("Encode:\n%s\nwant\n%s", data, want)
	}
	back, err := ParseLock("demo.lock", data)
	if err != nil {
		t.Fatal(err)
	}
	l.Path = "demo.lock"
	back.pos = nil // where each field was read: not part of the lock
	if !reflect.DeepEqual(back, l) {
		t.Errorf("round trip:\n%+v\nwant\n%+v", back, l)
	}
	again, err := back.Encode()
	if err != nil || string(again) != string(data) {
		t.Errorf("second Encode differs (%v):\n%s", err, again)
	}
	if err := back.Check(r); err != nil {
		t.Errorf("fresh lock: %v", err)
	}
	// A lock given where a recipe belongs is one clear error, not a list of
	// unknown fields.
	if _, err := Parse("demo.lock", data); err == nil || err.Error() != "demo.lock:3:7: kind: this is a lock file, not a recipe; give kiln the recipe (.yaml) it belongs to" {
		t.Errorf("lock as recipe: %v", err)
	}
	if img, ok := back.Image("quay.io/acme/db:3"); !ok || img.Digest != digestB {
		t.Errorf("Image(db) = %+v, %v", img, ok)
	}
	if _, ok := back.Image("quay.io/acme/nope:1"); ok {
		t.Error("Image(nope) found")
	}
}

func TestLockInputs(t *testing.T) {
	t.Parallel()
	base := lockRecipe(t).LockInputs()
	if !strings.HasPrefix(base, "sha256:") || len(base) != 71 {
		t.Fatalf("LockInputs = %q", base)
	}
	for _, c := range []struct {
		name   string
		edit   func(r *Recipe)
		stable bool
	}{
		{"reorder images", func(r *Recipe) { r.Images[0], r.Images[2] = r.Images[2], r.Images[0] }, true},
		{"serve and preload", func(r *Recipe) { r.Images[0].Serve, r.Images[0].Preload = ptr(false), ptr(true) }, true},
		{"everything else", func(r *Recipe) { r.Name, r.Disk.Size, r.Ignition.Version = "x", Size{Bytes: 1 << 30}, "3.4.0" }, true},
		{"empty source = docker name", func(r *Recipe) { r.Images[0].Source = "docker://quay.io/acme/app:1.2" }, true},
		{"arch", func(r *Recipe) { r.Arch = "arm64" }, false},
		{"source", func(r *Recipe) { r.Images[1].Source = "oci:layouts/db:4" }, false},
		{"name", func(r *Recipe) { r.Images[1].Name = "quay.io/acme/db:4" }, false},
		{"image removed", func(r *Recipe) { r.Images = r.Images[1:] }, false},
	} {
		r := lockRecipe(t)
		c.edit(r)
		if got := r.LockInputs(); (got == base) != c.stable {
			t.Errorf("%s: LockInputs changed = %v, want %v", c.name, got != base, !c.stable)
		}
	}
}

// TestLockCheck covers each kind of staleness and its message.
func TestLockCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		edit    func(r *Recipe, l *Lock)
		changes []string // nil: fresh
	}{
		{"fresh", func(*Recipe, *Lock) {}, nil},
		{"reordered", func(r *Recipe, _ *Lock) { r.Images[0], r.Images[1] = r.Images[1], r.Images[0] }, nil},
		{"preload changed", func(r *Recipe, _ *Lock) { r.Images[0].Preload = ptr(true) }, nil},
		{"arch", func(r *Recipe, _ *Lock) { r.Arch = "arm64" }, []string{"arch changed: the lock is for linux/amd64, the recipe is for linux/arm64"}},
		{"added", func(r *Recipe, _ *Lock) { r.Images = append(r.Images, Image{Name: "quay.io/acme/new:1"}) }, []string{"image added: quay.io/acme/new:1"}},
		{"removed", func(r *Recipe, _ *Lock) { r.Images = r.Images[:1] }, []string{"image removed: quay.io/acme/db:3", "image removed: quay.io/acme/agent@" + digestI}},
		{"source", func(r *Recipe, _ *Lock) { r.Images[0].Source = "oci:mirror/app:1.2" }, []string{"source changed for quay.io/acme/app:1.2: the lock has docker://quay.io/acme/app:1.2, the recipe has oci:mirror/app:1.2"}},
		{"renamed", func(r *Recipe, _ *Lock) { r.Images[1].Name = "quay.io/acme/db:4" }, []string{"image added: quay.io/acme/db:4", "image removed: quay.io/acme/db:3"}},
		{"pinned digest disagrees", func(_ *Recipe, l *Lock) { l.Images[2].IndexDigest = "" }, []string{"digest changed for quay.io/acme/agent@" + digestI + ": the lock has " + digestA}},
		{"hand-edited inputs", func(_ *Recipe, l *Lock) { l.Inputs = digestB }, []string{"the lock's inputs digest does not match the recipe (was the lock edited by hand?)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := lockRecipe(t)
			l := testLock(r)
			l.Path = "demo.lock"
			c.edit(r, l)
			err := l.Check(r)
			if c.changes == nil {
				if err != nil {
					t.Fatalf("want fresh, got %v", err)
				}
				return
			}
			var stale *StaleLockError
			if !errors.As(err, &stale) {
				t.Fatalf("want *StaleLockError, got %v", err)
			}
			if !reflect.DeepEqual(stale.Changes, c.changes) {
				t.Errorf("changes:\n%q\nwant\n%q", stale.Changes, c.changes)
			}
			if !strings.HasPrefix(err.Error(), "lock file demo.lock is out of date with recipe demo.yaml:\n  - ") ||
				!strings.HasSuffix(err.Error(), "\nrun `kiln lock demo.yaml` to refresh it") {
				t.Errorf("message:\n%v", err)
			}
		})
	}
}

func TestReadLockErrors(t *testing.T) {
	t.Parallel()
	const good = `apiVersion: kiln.dev/v1alpha1
kind: Lock
inputs: ` + digestA + `
platform: linux/amd64
images:
  - name: quay.io/acme/app:1.2
    source: docker://quay.io/acme/app:1.2
    digest: ` + digestB + `
    mediaType: application/vnd.oci.image.manifest.v1+json
    size: 10
`
	if _, err := ParseLock("l.lock", []byte(good)); err != nil {
		t.Fatalf("good lock: %v", err)
	}
	for _, c := range []struct{ name, old, new, want string }{
		{"kind recipe", "kind: Lock", "kind: Appliance", "l.lock:2:7: kind: this is a recipe, not a lock file; a lock file is written by `kiln lock RECIPE`"},
		{"kind other", "kind: Lock", "kind: Locked", `l.lock:2:7: kind: "Locked": a lock file has "kind: Lock"`},
		{"apiVersion", "v1alpha1", "v2", "l.lock:1:13: apiVersion: \"kiln.dev/v2\" is not a version this kiln reads; run `kiln lock RECIPE` to rewrite the lock"},
		{"inputs", "inputs: " + digestA, "inputs: sha256:abc", `l.lock:3:9: inputs: "sha256:abc" is not a sha256 digest; write sha256: followed by 64 lower-case hex digits (as sha256sum prints them)`},
		{"platform", "linux/amd64", "linux/s390x", `l.lock:4:11: platform: "linux/s390x" is not supported; use one of linux/amd64, linux/arm64`},
		{"digest upper case", digestB, strings.ToUpper(digestB), `l.lock:8:13: images[0].digest: "SHA256:2222222222222222222222222222222222222222222222222222222222222222" is not a sha256 digest; write sha256: followed by 64 lower-case hex digits (as sha256sum prints them)`},
		{"digest missing", "    digest: " + digestB + "\n", "", "l.lock:6:5: images[0].digest: required field is missing; run `kiln lock RECIPE` to rewrite the lock"},
		{"media type", "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json", `l.lock:9:16: images[0].mediaType: "application/vnd.oci.image.index.v1+json" is not supported; use one of application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json`},
		{"size", "size: 10", "size: 0", "l.lock:10:11: images[0].size: must be the image's size in bytes, greater than zero; run `kiln lock RECIPE` to rewrite the lock"},
		{"size type", "size: 10", "size: 10MiB", `l.lock:10:11: images[0].size: expected a whole number, got "10MiB"`},
		{"source", "source: docker://", "source: http://", `l.lock:7:13: images[0].source: source "http://quay.io/acme/app:1.2": kiln does not download from URLs; use docker://REGISTRY/REPOSITORY:TAG for a registry`},
		{"unknown field", "    size: 10\n", "    size: 10\n    sise: 10\n", `l.lock:11:5: images[0].sise: unknown field; did you mean "size"?`},
		{"name pins other digest", "name: quay.io/acme/app:1.2", "name: quay.io/acme/app@" + digestI, "l.lock:8:13: images[0].digest: " + digestB + ", but the name pins " + digestI + "; run `kiln lock RECIPE` to rewrite the lock"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(good, c.old) {
				t.Fatalf("%q not in the good lock", c.old)
			}
			_, err := ParseLock("l.lock", []byte(strings.Replace(good, c.old, c.new, 1)))
			if err == nil || err.Error() != c.want {
				t.Errorf("got\n%v\nwant\n%s", err, c.want)
			}
		})
	}
	if _, err := ReadLock(filepath.Join(t.TempDir(), "demo.lock")); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "kiln lock") {
		t.Errorf("missing lock: %v", err)
	}
}
