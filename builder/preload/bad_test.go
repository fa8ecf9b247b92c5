package preload

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
)

// TestBadInput feeds Build each kind of broken or hostile image and checks
// the exact message a technician gets, and that no store is left behind.
func TestBadInput(t *testing.T) {
	hostile := func(l layers.Layer, what string) func(t *testing.T, dir string) (Image, string) {
		return func(t *testing.T, dir string) (Image, string) {
			img, w := one(t, dir, layers.Spec{Name: "quay.io/evil/app:1", Layers: []layers.Layer{{layers.Dir("ok/", 0o755)}, l}})
			return img, fmt.Sprintf("preload quay.io/evil/app:1: layer 2 of 2 (%s): %s; the image is malformed or hostile: rebuild it or remove it from the recipe", w.Layers[1], what)
		}
	}
	for _, tc := range []struct {
		name  string
		input func(t *testing.T, dir string) (img Image, wantErr string)
		twice bool // list the name a second time, for another digest
	}{
		{name: "dot-dot path", input: hostile(layers.Layer{layers.File("ok/../../x", 0o644, "x")}, `tar entry "ok/../../x" leaves the layer root`)},
		{name: "absolute path", input: hostile(layers.Layer{layers.File("/etc/x", 0o644, "x")}, `tar entry "/etc/x" is an absolute path`)},
		{name: "write through relative symlink", input: hostile(layers.Layer{layers.Symlink("esc", "../../../../tmp"), layers.File("esc/pwned", 0o644, "x")},
			`tar entry "esc/pwned" is written through the symlink "esc" the same layer created`)},
		{name: "write through absolute symlink", input: hostile(layers.Layer{layers.Symlink("esc", "/etc"), layers.Dir("esc/sub/", 0o755)},
			`tar entry "esc/sub/" is written through the symlink "esc" the same layer created`)},
		{name: "hard link out", input: hostile(layers.Layer{layers.Link("hl", "../../etc/shadow", 0o600)},
			`hard link "hl" to "../../etc/shadow": the target leaves the layer root`)},
		{name: "hard link absolute", input: hostile(layers.Layer{layers.Link("hl", "/etc/shadow", 0o600)},
			`hard link "hl" to "/etc/shadow": the target is an absolute path`)},
		{name: "hard link to another layer", input: func(t *testing.T, dir string) (Image, string) {
			img, w := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Layers: []layers.Layer{
				{layers.File("a", 0o644, "a")}, {layers.Link("b", "a", 0o644)}}})
			return img, fmt.Sprintf(`preload quay.io/acme/app:1.2: layer 2 of 2 (%s): hard link "b" to "a": the target is not earlier in the same layer; the image is malformed: rebuild it or remove it from the recipe`, w.Layers[1])
		}},
		{name: "corrupt layer", input: func(t *testing.T, dir string) (Image, string) {
			img, w := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Layers: layers.Hello()})
			blob := filepath.Join(img.LayoutDir, "blobs", "sha256", w.Layers[0].Hex)
			b, err := os.ReadFile(blob)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(blob, b, 0o644); err != nil {
				t.Fatal(err)
			}
			return img, fmt.Sprintf("preload quay.io/acme/app:1.2: layer 1 of 1 (%s): blob %s is corrupt: its content hashes to sha256:%x; fetch the image again", w.Layers[0], blob, sha256.Sum256(b))
		}},
		{name: "missing layer", input: func(t *testing.T, dir string) (Image, string) {
			img, w := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Layers: layers.Hello()})
			blob := filepath.Join(img.LayoutDir, "blobs", "sha256", w.Layers[0].Hex)
			if err := os.Remove(blob); err != nil {
				t.Fatal(err)
			}
			return img, fmt.Sprintf("preload quay.io/acme/app:1.2: layer 1 of 1 (%s): blob %s is missing from the OCI layout; stage the image again", w.Layers[0], blob)
		}},
		{name: "wrong platform", input: func(t *testing.T, dir string) (Image, string) {
			img, w := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Arch: "arm64", Layers: layers.Hello()})
			return img, fmt.Sprintf("preload quay.io/acme/app:1.2: manifest %s is for platform linux/arm64, the appliance is linux/amd64; lock the image for linux/amd64", w.Digest)
		}},
		{name: "digest not in layout", input: func(t *testing.T, dir string) (Image, string) {
			img, _ := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Layers: layers.Hello()})
			img.Digest = "sha256:" + strings.Repeat("0", 64)
			return img, fmt.Sprintf("preload quay.io/acme/app:1.2: manifest %s not found in OCI layout %s (index.json lists 1 entries); stage the image or fix the lock", img.Digest, img.LayoutDir)
		}},
		{name: "bad name", input: func(t *testing.T, dir string) (Image, string) {
			img, _ := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Layers: layers.Hello()})
			img.Name = "Quay.io/ACME/App:1.2"
			return img, `preload Quay.io/ACME/App:1.2: invalid image name: invalid reference format: repository name must be lowercase`
		}},
		{name: "name twice", twice: true, input: func(t *testing.T, dir string) (Image, string) {
			img, w := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Layers: layers.Hello()})
			return img, fmt.Sprintf("preload: image name quay.io/acme/app:1.2 is listed twice, for %s and sha256:%s; a name can mean one image only: fix the recipe or lock", w.Digest, strings.Repeat("1", 64))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			img, want := tc.input(t, dir)
			store := filepath.Join(dir, "store")
			imgs := []Image{img}
			if tc.twice {
				imgs = append(imgs, Image{Name: img.Name, LayoutDir: img.LayoutDir, Digest: "sha256:" + strings.Repeat("1", 64)})
			}
			_, err := Build(context.Background(), store, imgs)
			if err == nil || err.Error() != want {
				t.Errorf("Build:\n got %v\nwant %s", err, want)
			}
			if _, err := os.Lstat(store); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("store %s left behind after a failed build (%v)", store, err)
			}
		})
	}
}

// TestFailedBuildLeavesNothing fails a build after the store was created
// and one image was written (the second image's layer passes the scan but
// cannot be unpacked: a file below a file), and checks nothing remains; a
// cancelled build stops before writing; an existing directory is never
// touched.
func TestFailedBuildLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	oci := filepath.Join(dir, "oci")
	w, err := layers.WriteLayout(oci,
		layers.Spec{Name: "quay.io/acme/good:1", Layers: layers.Hello()},
		layers.Spec{Name: "quay.io/acme/bad:1", Layers: []layers.Layer{{layers.File("f", 0o644, "f"), layers.File("f/x", 0o644, "x")}}})
	if err != nil {
		t.Fatal(err)
	}
	var imgs []Image
	for _, x := range w {
		imgs = append(imgs, Image{Name: x.Name, LayoutDir: oci, Digest: x.Digest.String()})
	}
	store := filepath.Join(dir, "store")
	_, err = Build(context.Background(), store, imgs)
	if prefix := fmt.Sprintf("preload quay.io/acme/bad:1 (%s): ", oci); err == nil || !strings.HasPrefix(err.Error(), prefix) {
		t.Errorf("Build: %v; want an error starting %q", err, prefix)
	}
	if _, err := os.Lstat(store); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("store %s left behind after a failed build (%v)", store, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Build(ctx, store, imgs[:1]); err == nil || err.Error() != "preload: context canceled" {
		t.Errorf("Build with a cancelled context: %v, want preload: context canceled", err)
	}
	if _, err := os.Lstat(store); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("store %s left behind after a cancelled build (%v)", store, err)
	}

	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(store, "keep")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Build(context.Background(), store, imgs)
	want := fmt.Sprintf("preload: store directory %s already exists; remove it or pick an empty staging path", store)
	if err == nil || err.Error() != want {
		t.Errorf("Build into an existing directory:\n got %v\nwant %s", err, want)
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "mine" {
		t.Errorf("Build touched the existing directory: %q, %v", b, err)
	}
}

func one(t *testing.T, dir string, spec layers.Spec) (Image, layers.Written) {
	t.Helper()
	oci := filepath.Join(dir, "oci")
	w, err := layers.WriteLayout(oci, spec)
	if err != nil {
		t.Fatal(err)
	}
	return Image{Name: spec.Name, LayoutDir: oci, Digest: w[0].Digest.String()}, w[0]
}

// TestCheckPrivileges runs the check in a child without CAP_SYS_ADMIN and
// CAP_CHOWN (dropped from the bounding set by setpriv, as a container
// runtime would) and checks it names both and says how to fix it.
// CAP_MKNOD is dropped too, yet not reported: since Linux 5.8 creating a
// 0:0 whiteout device needs no privilege.
func TestCheckPrivileges(t *testing.T) {
	if dir := os.Getenv("KILN_PRIVCHECK_DIR"); dir != "" {
		if err := CheckPrivileges(dir); err != nil {
			fmt.Println(err)
		}
		return
	}
	dir := t.TempDir()
	if err := CheckPrivileges(dir); err != nil {
		t.Fatalf("as root: %v", err)
	}
	cmd := exec.Command("setpriv", "--bounding-set", "-mknod,-sys_admin,-chown", "--inh-caps", "-mknod,-sys_admin,-chown",
		os.Args[0], "-test.run", "^TestCheckPrivileges$")
	cmd.Env = append(os.Environ(), "KILN_PRIVCHECK_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := fmt.Sprintf("preload: this build host cannot unpack container layers into %s: missing trusted.* xattrs for opaque directories (CAP_SYS_ADMIN) (operation not permitted), chown to any owner (CAP_CHOWN) (operation not permitted); run kiln build as root, or in a privileged container (podman run --privileged), on a filesystem with trusted.* xattr support such as ext4 or xfs", dir)
	if got := strings.SplitN(string(out), "\n", 2)[0]; got != want {
		t.Errorf("without CAP_MKNOD, CAP_SYS_ADMIN and CAP_CHOWN:\n got %s\nwant %s", got, want)
	}
}
