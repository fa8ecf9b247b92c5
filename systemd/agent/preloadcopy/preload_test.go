package preloadcopy

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

	bpreload "github.com/kiln-appliance/kiln/builder/preload"
	"github.com/kiln-appliance/kiln/partitions/sqfswrite"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"go.podman.io/storage/pkg/reexec"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	os.Exit(m.Run())
}

var specs = []layers.Spec{
	{Name: "quay.io/kiln/special:1.0", Layers: layers.Special()},
	{Name: "docker.io/library/hello:latest", Layers: layers.Hello()},
}

// nodeStore builds the preloaded store the way the factory does and
// mounts it as the node sees it: a read-only loop-mounted squashfs.
func nodeStore(t testing.TB, extra ...layers.Spec) (string, []layers.Written) {
	t.Helper()
	dir := t.TempDir()
	oci := filepath.Join(dir, "oci")
	written, err := layers.WriteLayout(oci, append(append([]layers.Spec{}, specs...), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return squashed(t, dir, oci, written), written
}

// squashed builds the store from the images written to oci and mounts it
// as the node does.
func squashed(t testing.TB, dir, oci string, written []layers.Written) string {
	t.Helper()
	var imgs []bpreload.Image
	for _, w := range written {
		imgs = append(imgs, bpreload.Image{Name: w.Name, LayoutDir: oci, Digest: w.Digest.String()})
	}
	store := filepath.Join(dir, "store")
	if _, err := bpreload.Build(context.Background(), store, imgs); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "storage.sqfs")
	if err := sqfswrite.WriteFile(context.Background(), store, img, sqfswrite.AsIs()); err != nil { // as the image partition is written
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, nil, "mount", "-o", "loop,ro,nodev,nosuid", img, mnt) // as var-lib-kiln-images.mount
	t.Cleanup(func() { unmount(t, mnt) })
	return mnt
}

// scratch is a temp dir with a short path (podman refuses run roots over
// 50 characters) that is removed only when nothing is mounted under it.
func scratch(t testing.TB) string {
	dir, err := os.MkdirTemp("", "kiln-pc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range mountsUnder(t, dir) {
			unmount(t, m)
		}
		if left := mountsUnder(t, dir); len(left) > 0 {
			t.Errorf("still mounted under %s: %v; not removing it", dir, left)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

func unmount(t testing.TB, p string) {
	if out, err := exec.Command("umount", p).CombinedOutput(); err != nil {
		t.Errorf("umount %s: %v: %s", p, err, out)
	}
	if contains(mountsUnder(t, filepath.Dir(p)), p) {
		t.Errorf("%s is still mounted", p)
	}
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(t testing.TB, dir string) []string {
	ms, err := layers.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func run(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// podman runs podman 4.3 configured only by conf, as on the node.
func podman(t *testing.T, conf, tmp string, args ...string) string {
	t.Helper()
	return run(t, []string{"CONTAINERS_STORAGE_CONF=" + conf}, "podman",
		append([]string{"--tmpdir", tmp, "--events-backend", "none", "--cgroup-manager", "cgroupfs"}, args...)...)
}

type listed struct {
	ID       string `json:"Id"`
	Digest   string
	Names    []string
	ReadOnly bool
}

func images(t *testing.T, conf, tmp string) map[string]listed {
	var ls []listed
	if err := json.Unmarshal([]byte(podman(t, conf, tmp, "images", "--format", "json")), &ls); err != nil {
		t.Fatal(err)
	}
	m := map[string]listed{}
	for _, l := range ls {
		m[l.ID] = l
	}
	return m
}

// TestStorageConfPodman: real podman 4.3, configured only by StorageConf's
// file, sees every preloaded image read-only with the lock's digests.
func TestStorageConfPodman(t *testing.T) {
	mnt, written := nodeStore(t)
	dir := scratch(t)
	conf := filepath.Join(dir, "storage.conf")
	text := contract.StorageConfig{GraphRoot: filepath.Join(dir, "root"), RunRoot: filepath.Join(dir, "run"), AdditionalImageStores: []string{mnt}}.Render()
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		t.Fatal(err)
	}
	got := images(t, conf, filepath.Join(dir, "tmp"))
	for _, w := range written {
		l, ok := got[w.ConfigID.Hex]
		if !ok || l.Digest != w.Digest.String() || !l.ReadOnly || !contains(l.Names, w.Name) {
			t.Errorf("podman images: %s is %+v; want ID %s, digest %s, read-only", w.Name, l, w.ConfigID.Hex, w.Digest)
		}
	}
}

// TestCopyToMainStore copies the preloaded images into a throwaway main
// store, checks podman (with no additional store) sees them with the same
// IDs and digests and the files the layers describe, and that a second run
// copies nothing.
func TestCopyToMainStore(t *testing.T) {
	mnt, written := nodeStore(t)
	dir := scratch(t)
	root, runRoot := filepath.Join(dir, "root"), filepath.Join(dir, "run")
	var log bytes.Buffer
	if err := CopyToMainStore(context.Background(), mnt, root, WithRunRoot(runRoot), WithLog(&log)); err != nil {
		t.Fatal(err)
	}
	t.Logf("first run:\n%s", log.String())
	for _, w := range written {
		if !strings.Contains(log.String(), fmt.Sprintf("preload-copy: %s (%s): copied ", w.Name, w.Digest)) {
			t.Errorf("log does not say %s was copied:\n%s", w.Name, log.String())
		}
	}

	conf := filepath.Join(dir, "storage.conf")
	if err := os.WriteFile(conf, contract.StorageConfig{GraphRoot: root, RunRoot: runRoot}.Render(), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	got := images(t, conf, tmp)
	all := map[string][]layers.Layer{}
	for _, s := range specs {
		all[s.Name] = s.Layers
	}
	for _, w := range written {
		l, ok := got[w.ConfigID.Hex]
		if !ok || l.Digest != w.Digest.String() || l.ReadOnly || !contains(l.Names, w.Name) {
			t.Errorf("podman images: %s is %+v; want ID %s, digest %s, writable", w.Name, l, w.ConfigID.Hex, w.Digest)
			continue
		}
		byDigest := strings.SplitN(w.Name, ":", 2)[0] + "@" + w.Digest.String()
		podman(t, conf, tmp, "image", "exists", byDigest)

		// A created, never started, container's root is the image's layers.
		ctr := "kiln-" + w.ConfigID.Hex[:12]
		podman(t, conf, tmp, "create", "--name", ctr, w.Name)
		merged := strings.TrimSpace(podman(t, conf, tmp, "mount", ctr))
		files, err := layers.Mounted(merged)
		podman(t, conf, tmp, "umount", ctr)
		podman(t, conf, tmp, "rm", ctr)
		if err != nil {
			t.Fatal(err)
		}
		if d := layers.Diff(layers.Listing(layers.Flatten(all[w.Name])), files); d != "" {
			t.Errorf("%s copied into the main store differs from its layers (- layers, + mounted):\n%s", w.Name, d)
		}
	}

	log.Reset()
	if err := CopyToMainStore(context.Background(), mnt, root, WithRunRoot(runRoot), WithLog(&log)); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("preload-copy: all %d preloaded images are in the main store\n", len(written)); !strings.HasSuffix(log.String(), want) || strings.Contains(log.String(), "copied") {
		t.Errorf("second run logged:\n%s\nwant no copies and %q", log.String(), want)
	}
}

// TestCopyOnly: WithOnly copies the images asked for (the node's restore
// asks for those a kept release lacks) and leaves the others.
func TestCopyOnly(t *testing.T) {
	mnt, written := nodeStore(t)
	if len(written) < 2 {
		t.Fatalf("the node store holds %d image(s); the test needs two", len(written))
	}
	dir := scratch(t)
	root, runRoot := filepath.Join(dir, "root"), filepath.Join(dir, "run")
	var log bytes.Buffer
	want, left := written[0], written[1]
	if err := CopyToMainStore(context.Background(), mnt, root, WithRunRoot(runRoot), WithLog(&log), WithOnly(want.ConfigID.Hex)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), fmt.Sprintf("preload-copy: %s (%s): copied ", want.Name, want.Digest)) || strings.Contains(log.String(), left.Name) {
		t.Errorf("log:\n%s\nwant %s copied and nothing of %s", log.String(), want.Name, left.Name)
	}
	conf := filepath.Join(dir, "storage.conf")
	if err := os.WriteFile(conf, contract.StorageConfig{GraphRoot: root, RunRoot: runRoot}.Render(), 0o644); err != nil {
		t.Fatal(err)
	}
	got := images(t, conf, filepath.Join(dir, "tmp"))
	if _, ok := got[want.ConfigID.Hex]; !ok {
		t.Errorf("%s is not in the main store", want.Name)
	}
	if _, ok := got[left.ConfigID.Hex]; ok {
		t.Errorf("%s was copied though not asked for", left.Name)
	}
}

// TestCopyNoSpace: a main store on a filesystem too small for the layers
// fails before writing anything, saying what is needed.
func TestCopyNoSpace(t *testing.T) {
	mnt, _ := nodeStore(t, layers.Spec{Name: "quay.io/acme/big:1", Layers: []layers.Layer{{
		layers.File("big", 0o644, strings.Repeat("kiln", 2<<20)), // 8 MiB, compresses to little
	}}})
	dir := scratch(t)
	small := filepath.Join(dir, "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, nil, "mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", small)
	root := filepath.Join(small, "root")
	err := CopyToMainStore(context.Background(), mnt, root, WithRunRoot(filepath.Join(dir, "run")), WithLog(&bytes.Buffer{}))
	// Opening the main store takes some of the 4 MiB; what is left is
	// what the message must report.
	var st unix.Statfs_t
	if err := unix.Statfs(small, &st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`preload-copy: %s has %d MiB free, copying the preloaded images needs 8 MiB; nothing was copied. Free space there or grow the disk, or build the appliance with preload mode "store", which needs no copy`, root, int64(st.Bavail)*st.Bsize>>20)
	if err == nil || err.Error() != want {
		t.Errorf("CopyToMainStore:\n got %v\nwant %s", err, want)
	}
	if _, err := os.Stat(filepath.Join(root, "overlay-layers", "layers.json")); err == nil {
		b, _ := os.ReadFile(filepath.Join(root, "overlay-layers", "layers.json"))
		if string(b) != "[]" && len(b) > 2 {
			t.Errorf("layers were written to the main store: %s", b)
		}
	}
}

func TestCopyNotAStore(t *testing.T) {
	dir := t.TempDir()
	err := CopyToMainStore(context.Background(), dir, filepath.Join(dir, "root"), WithRunRoot(filepath.Join(dir, "run")))
	want := fmt.Sprintf("preload-copy: %s is not a preloaded containers/storage store (stat %s/overlay-images/images.json: no such file or directory); is the kiln image partition mounted?", dir, dir)
	if err == nil || err.Error() != want {
		t.Errorf("CopyToMainStore:\n got %v\nwant %s", err, want)
	}
}

// TestStorageConfStoreMissing pins why CRI-O and podman must be ordered
// after the image partition's mount in mode "store": with the additional
// store absent, podman 4.3 refuses to run at all.
func TestStorageConfStoreMissing(t *testing.T) {
	dir := scratch(t)
	absent := filepath.Join(dir, "images", "storage")
	conf := filepath.Join(dir, "storage.conf")
	text := contract.StorageConfig{GraphRoot: filepath.Join(dir, "root"), RunRoot: filepath.Join(dir, "run"), AdditionalImageStores: []string{absent}}.Render()
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("podman", "--tmpdir", filepath.Join(dir, "tmp"), "--events-backend", "none", "images")
	cmd.Env = append(os.Environ(), "CONTAINERS_STORAGE_CONF="+conf)
	out, err := cmd.CombinedOutput()
	want := fmt.Sprintf("overlay: can't stat imageStore dir %s: stat %s: no such file or directory", absent, absent)
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("podman images without the preloaded store: %v\n%s\nwant failure %q", err, out, want)
	}
}
