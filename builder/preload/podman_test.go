package preload

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
)

// squashStore packs store into a squashfs the way the image partition is
// built and loop-mounts it read-only; the mount goes away (checked) before
// the test's temp dirs are removed.
func squashStore(t *testing.T, store string) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "storage.sqfs")
	run(t, "mksquashfs", store, img, "-noI", "-noD", "-noF", "-noX", "-no-fragments", "-quiet", "-no-progress")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-o", "loop,ro,nodev,nosuid", img, mnt) // as var-lib-kiln-images.mount
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
		if mounted(t, mnt) {
			t.Errorf("%s is still mounted", mnt)
		}
	})
	return mnt
}

// mounted reports whether p is a mount point, from /proc/self/mountinfo.
func mounted(t *testing.T, p string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(t testing.TB, dir string) []string {
	ms, err := layers.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// podman runs podman 4.3 with a throwaway main store and the preloaded
// store at additional as a read-only additional image store.
type podman struct {
	t    *testing.T
	conf string
	args []string
}

func newPodman(t *testing.T, additional string) *podman {
	// podman refuses a runroot longer than 50 characters; t.TempDir's are.
	dir, err := os.MkdirTemp("", "kiln-pm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The overlay driver makes its home a private bind mount of
		// itself; unmount that (and anything else left under dir), and
		// never remove a tree something is still mounted in.
		for _, m := range mountsUnder(t, dir) {
			if out, err := exec.Command("umount", m).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", m, err, out)
			}
		}
		if left := mountsUnder(t, dir); len(left) > 0 {
			t.Errorf("still mounted under %s: %v; not removing it", dir, left)
			return
		}
		os.RemoveAll(dir)
	})
	conf := filepath.Join(dir, "storage.conf")
	text := fmt.Sprintf(`[storage]
driver = "overlay"
graphroot = %q
runroot = %q

[storage.options]
additionalimagestores = [%q]
`, filepath.Join(dir, "root"), filepath.Join(dir, "run"), additional)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// Stores come from storage.conf only: podman 4.3 drops the
	// additional image stores when --root or --storage-driver is given.
	return &podman{t: t, conf: conf, args: []string{
		"--tmpdir", filepath.Join(dir, "tmp"), "--events-backend", "none", "--cgroup-manager", "cgroupfs",
	}}
}

func (p *podman) run(args ...string) string {
	p.t.Helper()
	cmd := exec.Command("podman", append(append([]string{}, p.args...), args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERS_STORAGE_CONF="+p.conf)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// TestPodmanReadsSquashedStore is the node's view: the store, packed into
// a squashfs and mounted read-only somewhere else than where it was built,
// serves every image to real podman with the lock's digests and the
// files the layers describe.
func TestPodmanReadsSquashedStore(t *testing.T) {
	dir := t.TempDir()
	imgs, written := fixtures(t, dir)
	store := filepath.Join(dir, "store")
	res, err := Build(context.Background(), store, imgs, WithTime(time.Unix(1700000000, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Images) != len(imgs) || res.Size <= 0 {
		t.Fatalf("result %+v", res)
	}
	mnt := squashStore(t, store)
	pm := newPodman(t, mnt)

	var listed []struct {
		ID       string `json:"Id"`
		Digest   string
		Names    []string
		ReadOnly bool
	}
	if err := json.Unmarshal([]byte(pm.run("images", "--format", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != len(written) {
		t.Fatalf("podman images lists %d images, want %d: %+v", len(listed), len(written), listed)
	}
	specs := map[string][]layers.Layer{
		"quay.io/kiln/special:1.0":       layers.Special(),
		"docker.io/library/hello:latest": layers.Hello(),
		"quay.io/kiln/undated:1":         layers.Hello(),
	}
	for _, w := range written {
		t.Run(w.Name, func(t *testing.T) {
			found := false
			for _, l := range listed {
				if l.ID != w.ConfigID.Hex {
					continue
				}
				found = true
				if l.Digest != w.Digest.String() || !l.ReadOnly || !contains(l.Names, w.Name) {
					t.Errorf("podman images: %+v; want digest %s, read-only, named %s", l, w.Digest, w.Name)
				}
			}
			if !found {
				t.Fatalf("podman images does not list %s (ID %s)", w.Name, w.ConfigID.Hex)
			}

			var inspect []struct {
				ID          string `json:"Id"`
				Digest      string
				RepoDigests []string
				RepoTags    []string
			}
			if err := json.Unmarshal([]byte(pm.run("image", "inspect", w.Name)), &inspect); err != nil {
				t.Fatal(err)
			}
			byDigest := strings.SplitN(w.Name, ":", 2)[0] + "@" + w.Digest.String()
			if len(inspect) != 1 || inspect[0].ID != w.ConfigID.Hex || inspect[0].Digest != w.Digest.String() ||
				!contains(inspect[0].RepoDigests, byDigest) || !contains(inspect[0].RepoTags, w.Name) {
				t.Errorf("podman image inspect %s: %+v; want ID %s, Digest %s, RepoDigests ∋ %s", w.Name, inspect, w.ConfigID.Hex, w.Digest, byDigest)
			}
			// Resolvable by digest alone, as CRI-O pins and pulls by digest.
			pm.run("image", "exists", byDigest)

			// podman 4.3 cannot `image mount` an image of a read-only
			// store ("layer not known"); a created (never started)
			// container's root is the same overlay of the image's layers.
			ctr := "kiln-" + w.ConfigID.Hex[:12]
			pm.run("create", "--name", ctr, w.Name)
			merged := strings.TrimSpace(pm.run("mount", ctr))
			t.Cleanup(func() {
				pm.run("umount", ctr)
				pm.run("rm", ctr)
				if mounted(t, merged) {
					t.Errorf("%s is still mounted", merged)
				}
			})
			got, err := layers.Mounted(merged)
			if err != nil {
				t.Fatal(err)
			}
			want := layers.Listing(layers.Flatten(specs[w.Name]))
			if d := layers.Diff(want, got); d != "" {
				t.Errorf("podman image mount %s differs from its layers (- layers, + mounted):\n%s", w.Name, d)
			}
		})
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
