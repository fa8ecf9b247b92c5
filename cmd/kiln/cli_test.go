package main

// Black-box tests of the kiln binary: each runs the real command on inputs
// generated here (base disk, OCI layouts), then checks the output with the
// real tools (sgdisk, the kernel's squashfs, e2fsck, skopeo,
// ignition-validate).

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/kilnbin"
	"github.com/kiln-appliance/kiln/test/loopmount"
)

var kilnBin string

func TestMain(m *testing.M) {
	if importHelper() { // never returns: a child of TestImportOS's crash test
		return
	}
	dir, err := os.MkdirTemp("", "kiln-cli-test-")
	if err != nil {
		panic(err)
	}
	kilnBin = filepath.Join(dir, "kiln")
	// The node's edition beside kiln, as `make build` leaves it: builds use it.
	for _, b := range []struct{ tags, path string }{{kilnbin.Factory, kilnBin}, {kilnbin.Node, filepath.Join(dir, "kiln-agent")}} {
		if err := kilnbin.Build(b.tags, b.path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is a recipe directory with a base disk and an OCI layout.
type fixture struct {
	dir    string
	cache  string
	recipe string
}

const (
	servedRef    = "quay.io/acme/app:1.2"
	preloadedRef = "registry.example.com/acme/tool:0.1"
)

// shared inputs, made once: a base disk and a layout with two images.
var inputs struct {
	dir     string
	digests map[string]string
}

func makeInputs(t *testing.T) {
	t.Helper()
	if inputs.dir != "" {
		return
	}
	dir, err := os.MkdirTemp("", "kiln-cli-inputs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := basedisk.Write(filepath.Join(dir, "base.raw")); err != nil {
		t.Fatal(err)
	}
	if err := basedisk.Write(filepath.Join(dir, "noboot.raw"), basedisk.WithoutBoot()); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]int64{"ab.raw": 8, "ab-small-b.raw": 7} {
		if err := basedisk.Write(filepath.Join(dir, name), basedisk.WithABSlots(8<<20, b<<20, abRootHash)); err != nil {
			t.Fatal(err)
		}
	}
	inputs.digests = map[string]string{}
	for _, ref := range []string{servedRef, preloadedRef} {
		d, err := images.HelloImage(filepath.Join(dir, "oci"), ref, "amd64", "arm64")
		if err != nil {
			t.Fatal(err)
		}
		inputs.digests[ref] = d
	}
	if _, err := images.HelloImage(filepath.Join(dir, "oci-arm"), "quay.io/acme/armonly:1", "arm64"); err != nil {
		t.Fatal(err)
	}
	inputs.dir = dir
}

// abRootHash is usr-a's root hash in the A/B bases' boot loader entry.
const abRootHash = "b2e4228ca6fb34ff3dbf3e8ddd0fe4ad4a1eac87cf737b97295d7d321a118471"

const recipeTemplate = `apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: test
version: 1.0.0
arch: amd64
base:
  path: %s
disk:
  size: %s
images:
  - name: quay.io/acme/app:1.2
    source: oci:%s/oci:quay.io/acme/app:1.2
  - name: registry.example.com/acme/tool:0.1
    source: oci:%s/oci:registry.example.com/acme/tool:0.1
%s`

func newFixture(t *testing.T, base, diskSize, preload string) *fixture {
	t.Helper()
	makeInputs(t)
	dir := t.TempDir()
	f := &fixture{dir: dir, cache: filepath.Join(dir, "cache"), recipe: filepath.Join(dir, "appliance.yaml")}
	second := "" // served (the default)
	if preload == "true" {
		second = "    serve: false\n    preload: true\n"
	}
	recipe := fmt.Sprintf(recipeTemplate, filepath.Join(inputs.dir, base), diskSize, inputs.dir, inputs.dir, second)
	if err := os.WriteFile(f.recipe, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// kiln runs the kiln binary and returns stdout+stderr and the exit code.
func kiln(t *testing.T, f *fixture, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(kilnBin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+f.cache)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func mustKiln(t *testing.T, f *fixture, args ...string) string {
	t.Helper()
	out, code := kiln(t, f, args...)
	if code != 0 {
		t.Fatalf("kiln %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}

// fileBytes is a file's size as kiln prints sizes.
func fileBytes(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return human.Bytes(fi.Size())
}

// mountImagePartition loop-mounts the disk's image partition read-only with
// the kernel's own squashfs driver.
func mountImagePartition(t testing.TB, disk string) string {
	t.Helper()
	return mountPartition(t, disk, contract.PartitionName)
}

// mountPartition loop-mounts the disk's squashfs partition of that name.
func mountPartition(t testing.TB, disk, name string) string {
	t.Helper()
	layout, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := layout.Find(name)
	if !ok {
		t.Fatalf("no %s partition", name)
	}
	return loopmount.Squashfs(t, disk, p.Offset, p.Size)
}

func TestBuildDiskIsRealAndReadable(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "true")
	disk := filepath.Join(f.dir, "out.raw")
	out := mustKiln(t, f, "build", f.recipe, "-o", disk)
	if !strings.Contains(out, "wrote "+disk) {
		t.Errorf("build output does not say what it wrote:\n%s", out)
	}
	if !strings.Contains(out, "\nagent: kiln-agent ") || !strings.Contains(out, "node edition") {
		t.Errorf("build output does not say which agent the disk carries:\n%s", out)
	}

	run(t, "sgdisk", "-v", disk)

	// The lock pins the platform's manifest, not the multi-arch index.
	lockOut := mustKiln(t, f, "inspect", "-o", "json", disk)
	var rep builder.Report
	if err := json.Unmarshal([]byte(lockOut), &rep); err != nil {
		t.Fatalf("inspect -o json: %v\n%s", err, lockOut)
	}
	if len(rep.Contents.Images) != 2 {
		t.Fatalf("kiln.json lists %d images, want 2", len(rep.Contents.Images))
	}
	if rep.OSSlots != nil || rep.Contents.OSSlots != nil || !strings.Contains(lockOut, `"osSlots": null`) {
		t.Errorf("a base without slots: inspect says OS slots %+v, kiln.json %+v", rep.OSSlots, rep.Contents.OSSlots)
	}
	for _, img := range rep.Contents.Images {
		if img.Digest == inputs.digests[img.Name] {
			t.Errorf("%s: locked the index digest %s, want the amd64 manifest", img.Name, img.Digest)
		}
	}

	// The kernel mounts the partition; skopeo reads every served image from
	// it by name, with the lock's digest.
	mnt := mountImagePartition(t, disk)
	for _, img := range rep.Contents.Images {
		if !img.Served {
			if _, err := os.Stat(filepath.Join(mnt, contract.StorageDir)); err != nil {
				t.Errorf("preloaded %s but no store on the partition: %v", img.Name, err)
			}
			continue
		}
		raw := run(t, "skopeo", "inspect", "--raw", "oci:"+filepath.Join(mnt, contract.OCIDir)+":"+img.Name)
		sum := sha256.Sum256([]byte(raw))
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != img.Digest {
			t.Errorf("%s: skopeo read manifest %s, lock says %s", img.Name, got, img.Digest)
		}
		run(t, "skopeo", "copy", "--quiet", "oci:"+filepath.Join(mnt, contract.OCIDir)+":"+img.Name, "dir:"+t.TempDir())
	}
	if fi, err := os.Stat(filepath.Join(mnt, contract.AgentBinary)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("agent binary: %v, %v; want mode 0755", fi, err)
	}
	// The node gets the node's edition from beside kiln, not kiln itself.
	onDisk, _ := os.ReadFile(filepath.Join(mnt, contract.AgentBinary))
	nodeEdition, _ := os.ReadFile(filepath.Join(filepath.Dir(kilnBin), "kiln-agent"))
	if len(onDisk) == 0 || !bytes.Equal(onDisk, nodeEdition) {
		t.Errorf("%s on the partition (%d bytes) is not kiln-agent (%d bytes)", contract.AgentBinary, len(onDisk), len(nodeEdition))
	}
	// The node's registry runs as an unprivileged dynamic user: everything
	// it serves must be world-readable.
	for _, dir := range []string{contract.OCIDir, contract.ContentsFile} {
		filepath.Walk(filepath.Join(mnt, dir), func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode()&0o004 == 0 {
				t.Errorf("%s: mode %v is not world-readable", p, fi.Mode())
			}
			return nil
		})
	}

	// The Ignition config in the boot partition is valid for the real validator.
	ign, err := bootconfig.Read(disk)
	if err != nil {
		t.Fatal(err)
	}
	ignPath := filepath.Join(f.dir, "config.ign")
	os.WriteFile(ignPath, ign, 0o644)
	run(t, "ignition-validate", ignPath)
	if !strings.Contains(string(ign), "kiln-registry.service") {
		t.Errorf("ignition config has no kiln units")
	}

	mustKiln(t, f, "verify", disk)
	text := mustKiln(t, f, "inspect", disk)
	for _, want := range []string{"kiln-images", servedRef, preloadedRef, "oci/", "storage/",
		"\nOS upgrades: none (the base has no A/B slots; a release changes images and files only)\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, text)
		}
	}
}

// TestBuildABBase: a base with the OS in A/B slots (usr and usr-verity
// partitions, the release's entry on the ESP naming usr-a and its root
// hash): inspect says so of the base, the build keeps the slots' partitions
// and records them in kiln.json, where the node reads them, and inspect
// says so of the disk.
func TestBuildABBase(t *testing.T) {
	f := newFixture(t, "ab.raw", "fit", "false")
	base := filepath.Join(inputs.dir, "ab.raw")
	line := "\nOS slots: usr-a (active, entry kiln-1.0, root hash b2e4228ca6fb…) and usr-b (empty), 8.0 MiB each\n"
	if out := mustKiln(t, f, "inspect", base); !strings.Contains(out, line) {
		t.Errorf("inspect of the base lacks %q:\n%s", line, out)
	}
	disk := filepath.Join(f.dir, "out.raw")
	mustKiln(t, f, "build", f.recipe, "-o", disk)
	run(t, "sgdisk", "-v", disk)
	if out := mustKiln(t, f, "inspect", disk); !strings.Contains(out, line) {
		t.Errorf("inspect of the disk lacks %q:\n%s", line, out)
	}
	var rep builder.Report
	if err := json.Unmarshal([]byte(mustKiln(t, f, "inspect", "-o", "json", disk)), &rep); err != nil {
		t.Fatal(err)
	}
	s := rep.Contents.OSSlots
	if s == nil {
		t.Fatal("kiln.json has no osSlots")
	}
	if s.Arch != "amd64" || s.Active != contract.SlotA || s.Entry != basedisk.ABEntry || s.RootHash != abRootHash {
		t.Errorf("kiln.json: %+v", s)
	}
	for i, want := range [][2]string{{basedisk.UsrAGUID, basedisk.UsrAVerityGUID}, {basedisk.UsrBGUID, basedisk.UsrBVerityGUID}} {
		sl := s.Slots[i]
		for j, p := range []contract.SlotPartition{sl.Usr, sl.UsrVerity} {
			got, ok := rep.Layout.Find(p.Name)
			if p.PartUUID != strings.ToLower(want[j]) || !ok || got.GUID != want[j] || got.Size != p.Size {
				t.Errorf("slot %s: %+v; on the disk: %+v", sl.Name, p, got)
			}
		}
	}
	// The node reads the same from the partition, as the kernel mounts it.
	c, err := contract.Read(mountImagePartition(t, disk))
	if err != nil || c.OSSlots == nil || !reflect.DeepEqual(c.OSSlots, s) || s.Boot == nil || len(s.Boot.Entries) != 1 {
		t.Errorf("kiln.json on the partition: %+v, %v", c, err)
	}
}

func TestBuildIsReproducible(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "true")
	a, b := filepath.Join(f.dir, "a.raw"), filepath.Join(f.dir, "b.raw")
	mustKiln(t, f, "build", f.recipe, "-o", a)
	// A second build from a cold cache (fetching again) gives the same bytes.
	os.RemoveAll(f.cache)
	mustKiln(t, f, "build", f.recipe, "-o", b)
	if ha, hb := sha256File(t, a), sha256File(t, b); ha != hb {
		t.Fatalf("two builds differ: %s vs %s", ha, hb)
	}
	// A third from the warm cache copies the verity tree the second kept.
	c := filepath.Join(f.dir, "c.raw")
	if log := mustKiln(t, f, "build", f.recipe, "-o", c); !strings.Contains(log, keptTreeStep) {
		t.Errorf("the warm rebuild hashed its verity tree again:\n%s", log)
	}
	if ha, hc := sha256File(t, a), sha256File(t, c); ha != hc {
		t.Fatalf("the warm rebuild differs: %s vs %s", ha, hc)
	}
	mustKiln(t, f, "verify", c)
}

func TestVerifyFindsTampering(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	disk := filepath.Join(f.dir, "out.raw")
	mustKiln(t, f, "build", f.recipe, "-o", disk)
	layout, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := layout.Find(contract.PartitionName)
	// Flip one byte in the middle of the image partition (file data).
	fd, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := p.Offset + 4096*3
	buf := make([]byte, 1)
	fd.ReadAt(buf, off)
	buf[0] ^= 0xff
	fd.WriteAt(buf, off)
	fd.Close()
	out, code := kiln(t, f, "verify", disk)
	if code != 1 || !strings.Contains(out, "failed verification") || !strings.Contains(out, "image partition") {
		t.Fatalf("verify of a tampered disk: exit %d, want 1 naming the image partition\n%s", code, out)
	}
	// Put the byte back and damage the disk's last byte (the reserved rest
	// of the backup GPT header sector, which verify once let by).
	fd, _ = os.OpenFile(disk, os.O_RDWR, 0)
	buf[0] ^= 0xff
	fd.WriteAt(buf, off)
	last := []byte{0}
	fd.ReadAt(last, layout.Size-1)
	fd.WriteAt([]byte{last[0] ^ 1}, layout.Size-1)
	out, code = kiln(t, f, "verify", disk)
	if code != 1 || !strings.Contains(out, "GPT headers") {
		t.Fatalf("verify with the disk's last byte changed: exit %d, want 1 naming the GPT headers\n%s", code, out)
	}
	fd.WriteAt(last, layout.Size-1)
	// Damage boot instead: exit 1 with the --booted hint; with --booted,
	// OK with boot listed as not checked.
	boot, _ := layout.Find("boot")
	fd.WriteAt([]byte("node was here"), boot.Offset+boot.Size/2)
	fd.Close()
	out, code = kiln(t, f, "verify", disk)
	if code != 1 || !strings.Contains(out, "(boot)") || !strings.Contains(out, "--booted") {
		t.Fatalf("verify of a disk with boot changed: exit %d\n%s", code, out)
	}
	out = mustKiln(t, f, "verify", "--booted", disk)
	if !strings.Contains(out, "not checked  partition") || !strings.Contains(out, "(boot): the node writes it") || !strings.Contains(out, "dm-verity") {
		t.Fatalf("verify --booted:\n%s", out)
	}
}

func TestBadInput(t *testing.T) {
	tests := []struct {
		name     string
		base     string
		diskSize string
		edit     func(t *testing.T, f *fixture)
		args     func(f *fixture) []string
		want     []string
	}{
		{
			name: "malformed yaml",
			edit: func(t *testing.T, f *fixture) { appendFile(t, f.recipe, "images: [\n") },
			want: []string{"appliance.yaml:"},
		},
		{
			name: "unknown field",
			edit: func(t *testing.T, f *fixture) { appendFile(t, f.recipe, "colour: blue\n") },
			want: []string{"appliance.yaml:15:1", "colour"},
		},
		{
			name: "missing base",
			base: "nonexistent.raw",
			want: []string{"nonexistent.raw"},
		},
		{
			name: "base without boot partition",
			base: "noboot.raw",
			// base.path's line: refused as the base is read, before the lock and the fetch.
			want: []string{"appliance.yaml:7:9: base.path:", `no partition named or labelled "boot"`, "docs/base.md"},
		},
		{
			name: "A/B base whose slot B is smaller than A",
			base: "ab-small-b.raw",
			want: []string{"appliance.yaml:7:", `"usr-b" (7.0 MiB) is smaller than "usr-a" (8.0 MiB)`},
		},
		{
			name: "image not found",
			edit: func(t *testing.T, f *fixture) {
				replaceInFile(t, f.recipe, "oci:quay.io/acme/app:1.2", "oci:quay.io/acme/nope:9")
			},
			want: []string{"quay.io/acme/nope:9"},
		},
		{
			name: "image without the platform",
			edit: func(t *testing.T, f *fixture) {
				replaceInFile(t, f.recipe, inputs.dir+"/oci:quay.io/acme/app:1.2", inputs.dir+"/oci-arm:quay.io/acme/armonly:1")
			},
			want: []string{"amd64", "arm64"},
		},
		{
			name: "foreign arch without an agent binary",
			edit: func(t *testing.T, f *fixture) { replaceInFile(t, f.recipe, "arch: amd64", "arch: arm64") },
			want: []string{"arm64", "--agent"},
		},
		{
			name: "agent binary for the wrong arch",
			edit: func(t *testing.T, f *fixture) { replaceInFile(t, f.recipe, "arch: amd64", "arch: arm64") },
			args: func(f *fixture) []string {
				return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw"), "--agent", "/bin/true"}
			},
			want: []string{"/bin/true is for EM_X86_64", "EM_AARCH64"},
		},
		{
			name: "agent is not an executable",
			args: func(f *fixture) []string {
				return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw"), "--agent", "/etc/passwd"}
			},
			want: []string{"/etc/passwd: not a Linux executable"},
		},
		{
			name:     "disk too small",
			diskSize: "64MiB",
			want:     []string{"too small", "at least"},
		},
		{
			name: "output directory not writable",
			args: func(f *fixture) []string {
				return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "no", "such", "dir", "out.raw")}
			},
			want: []string{"cannot write the output"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, size := tt.base, tt.diskSize
			if base == "" {
				base = "base.raw"
			}
			if size == "" {
				size = "fit"
			}
			f := newFixture(t, base, size, "false")
			if tt.edit != nil {
				tt.edit(t, f)
			}
			out := filepath.Join(f.dir, "out.raw")
			if err := os.WriteFile(out, []byte("previous disk"), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"build", f.recipe, "-o", out}
			if tt.args != nil {
				args = tt.args(f)
			}
			msg, code := kiln(t, f, args...)
			if code == 0 {
				t.Fatalf("build succeeded, want failure:\n%s", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error message lacks %q:\n%s", w, msg)
				}
			}
			assertUntouched(t, f.dir, out)
		})
	}
}

func TestCorruptBlobIsRefused(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	// A private copy of the layout whose layer bytes no longer match.
	layoutDir := privateLayout(t, f)
	_, _, layers, err := images.Blobs(layoutDir, servedRef)
	if err != nil {
		t.Fatal(err)
	}
	if err := images.CorruptBlob(layoutDir, layers[0]); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(f.dir, "out.raw")
	if err := os.WriteFile(out, []byte("previous disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	msg, code := kiln(t, f, "build", f.recipe, "-o", out)
	if code == 0 || !strings.Contains(msg, layers[0]) {
		t.Fatalf("build with a corrupt blob: exit %d, want an error naming %s:\n%s", code, layers[0], msg)
	}
	assertUntouched(t, f.dir, out)
	// Nothing unverified is kept: the bad blob is in the cache under no name.
	if _, err := os.Stat(filepath.Join(f.cache, "kiln", "blobs", "sha256", strings.TrimPrefix(layers[0], "sha256:"))); err == nil {
		t.Errorf("the corrupt blob %s was cached", layers[0])
	}
}

// privateLayout gives the fixture a layout of its own (to damage or chmod),
// locked, and returns its directory.
func privateLayout(t *testing.T, f *fixture) string {
	t.Helper()
	layoutDir := filepath.Join(f.dir, "oci")
	for _, ref := range []string{servedRef, preloadedRef} {
		if _, err := images.HelloImage(layoutDir, ref, "amd64"); err != nil {
			t.Fatal(err)
		}
	}
	replaceInFile(t, f.recipe, inputs.dir+"/oci:", layoutDir+":")
	replaceInFile(t, f.recipe, inputs.dir+"/oci:", layoutDir+":")
	mustKiln(t, f, "lock", f.recipe)
	return layoutDir
}

func TestStaleLockIsRefused(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	mustKiln(t, f, "lock", f.recipe)
	replaceInFile(t, f.recipe, "registry.example.com/acme/tool:0.1\n    source", "registry.example.com/acme/tool:0.2\n    source")
	out := filepath.Join(f.dir, "out.raw")
	msg, code := kiln(t, f, "build", f.recipe, "-o", out)
	if code == 0 || !strings.Contains(msg, "out of date") || !strings.Contains(msg, "kiln lock") {
		t.Fatalf("build with a stale lock: exit %d\n%s", code, msg)
	}
	mustKiln(t, f, "build", "--refresh-lock", f.recipe, "-o", out)
}

func TestInterruptLeavesNothing(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "true")
	out := filepath.Join(f.dir, "out.raw")
	if err := os.WriteFile(out, []byte("previous disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Interrupt as each long step starts (its progress line), so every run
	// is cut short at a known place; a build that finishes anyway fails.
	for _, step := range []string{"stage image partition", "write image filesystem", "check blobs read in place", "copy base partitions"} {
		code, log := interruptAt(t, f.cache, step, "build", f.recipe, "-o", out)
		if code != 130 {
			t.Errorf("SIGINT when %q started: exit %d, want 130\n%s", step, code, log)
		}
		// The user reads what happened in their words, the task too. A
		// short step may end before the signal lands (on a loaded machine
		// "check blobs read in place" takes 27 ms): then the last line says it.
		cut := strings.Contains(log, step+": interrupted after ") || strings.Contains(log, step+": done")
		if strings.Contains(log, "context canceled") || !cut ||
			!strings.Contains(log, "\nkiln: ") || !strings.Contains(log[strings.LastIndex(log, "\nkiln: "):], "interrupted") {
			t.Errorf("SIGINT when %q started: the messages do not say interrupted:\n%s", step, log)
		}
		assertUntouched(t, f.dir, out)
		leftovers, _ := filepath.Glob(filepath.Join(f.cache, "kiln", "build-*"))
		if len(leftovers) > 0 {
			t.Errorf("SIGINT when %q started: staging left behind: %v", step, leftovers)
		}
	}
}

// interruptAt runs kiln with args and sends it SIGINT as step starts (its
// progress line); it returns the exit code (a run that finishes anyway
// returns 0) and what kiln printed.
func interruptAt(t *testing.T, cache, step string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(kilnBin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		// step names the task, or starts its name ("record " for "record DISK").
		if line := sc.Text(); strings.HasPrefix(line, step) && strings.Contains(line, ": started") {
			cmd.Process.Signal(syscall.SIGINT)
			break
		}
	}
	io.Copy(&log, stderr)
	cmd.Wait()
	return cmd.ProcessState.ExitCode(), log.String()
}

// assertUntouched checks the previous output is as it was and no temp file is left.
func assertUntouched(t *testing.T, dir, out string) {
	t.Helper()
	b, err := os.ReadFile(out)
	if err != nil {
		t.Errorf("failed build removed or hid the previous %s: %v", out, err)
	} else if string(b) != "previous disk" {
		t.Errorf("failed build replaced %s", out)
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, ".*kiln-tmp-*"))
	if len(tmps) > 0 {
		t.Errorf("temp files left behind: %v", tmps)
	}
}

func appendFile(t *testing.T, p, s string) {
	t.Helper()
	b, _ := os.ReadFile(p)
	os.WriteFile(p, append(b, s...), 0o644)
}

func replaceInFile(t *testing.T, p, old, new string) {
	t.Helper()
	b, _ := os.ReadFile(p)
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("%s does not contain %q", p, old)
	}
	os.WriteFile(p, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644)
}

// flipByte inverts the byte at off (from the end when negative).
func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off < 0 {
		fi, _ := f.Stat()
		off += fi.Size()
	}
	b := make([]byte, 1)
	f.ReadAt(b, off)
	b[0] ^= 0xff
	f.WriteAt(b, off)
}
