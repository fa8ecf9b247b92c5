//go:build e2e

package e2e

import (
	"bytes"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coreos/ignition/v2/config/v3_3/types"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ggcrtypes "github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/guest"
	"github.com/kiln-appliance/kiln/test/e2e/rawdisk"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/treecmp"

	"github.com/kiln-appliance/kiln/test/e2e/repo"
)

//go:embed testdata/appliance-lib.sh
var applianceLib string

//go:embed testdata/appliance-boot.sh
var applianceBoot string

//go:embed testdata/appliance-fault.sh
var applianceFault string

// The check scripts with the shared helpers put in place of their #@LIB@ line.
var (
	applianceBootCheck  = withLib(applianceBoot)
	applianceFaultCheck = withLib(applianceFault)
)

func withLib(script string) string {
	if !strings.Contains(script, "#@LIB@\n") {
		panic("appliance check script has no #@LIB@ line")
	}
	return strings.Replace(script, "#@LIB@\n", applianceLib, 1)
}

// The appliance's images, all built from the hello fixture (they share its
// one layer; each has its own config, hence its own digest; the served-only
// one gets a second layer of its own, see addOwnLayer).
const (
	helloRef     = "quay.io/kiln-e2e/hello:1.0"               // served + preloaded
	servedRef    = "registry.example.com/kiln-e2e/served:1.0" // served only; plus a layer of its own
	preloadedRef = "quay.io/kiln-e2e/preloaded:1.0"           // preloaded only
)

// appliance is a disk built by the real kiln, and what the test knows about
// it independently of the guest.
type appliance struct {
	disk    string
	kiln    string            // the kiln binary that built it
	layout  string            // the OCI layout the images came from
	digests map[string]string // ref -> manifest digest, as HelloImage wrote it
	layer   string            // the served image's layer digest
	info    inspectOut
}

// inspectOut is the part of `kiln inspect -o json` the tests read.
type inspectOut struct {
	Layout struct {
		Partitions []struct {
			Number int    `json:"number"`
			Name   string `json:"name"`
			GUID   string `json:"guid"`
			Offset int64  `json:"offset"`
			Size   int64  `json:"size"`
		} `json:"partitions"`
	} `json:"layout"`
	Contents *struct {
		Images []struct {
			Name   string `json:"name"`
			Digest string `json:"digest"`
		} `json:"images"`
		Files []struct {
			Path   string `json:"path"`
			Digest string `json:"digest"`
		} `json:"files"`
	} `json:"contents"`
}

// imagePartition returns the GPT entry of the image partition: the one
// partition the base does not have.
func (a *appliance) imagePartition(t *testing.T) (number int, guid string, offset, size int64) {
	t.Helper()
	for _, p := range a.info.Layout.Partitions {
		switch p.Name {
		case "EFI-SYSTEM", "boot", "root":
			continue
		}
		return p.Number, p.GUID, p.Offset, p.Size
	}
	t.Fatalf("kiln inspect lists no image partition: %+v", a.info.Layout.Partitions)
	return
}

// TestApplianceBoots: a factory image's first boot, offline, brings the
// images up exactly as docs/units.md says (mount by GUID, registry READY,
// mirror only after READY, preloaded images present and runnable, a served
// image pulled through the mirror, exact pins, registry gone once first boot
// is done); then the power is cut while CRI-O runs the workload and a pod of
// the served image (issue 27), and the next boot runs nothing of the first
// boot again, restores what CRI-O lost before the workload starts, and has
// every image, the workload and the served pod running offline.
func TestApplianceBoots(t *testing.T) {
	vm.Schedule(t, 9*time.Minute)
	a := buildAppliance(t, applianceBootCheck, withPowerCut())
	_, guid, _, _ := a.imagePartition(t)

	run, first, second := bootWithPowerCut(t, a.disk, "boots", applianceTimeout(24*time.Minute))
	requireAllPass(t, run)
	requireDetail(t, first, "boot", "n=1")
	requireDetail(t, first, "mount-partuuid", strings.ToLower(guid))
	for _, name := range []string{
		"ignition", "upstreams-dead", "mount-ro", "mount-verity", "registry-ready", "mirror-after-ready",
		"image-hello", "image-preloaded", "run-hello", "run-preloaded", "pull-served", "registry-served-pull", "pins", "firstboot-done", "registry-stopped", "mirror-removed",
		// CRI-O, through the CRI (crio_test.go)
		"crio-after-mount", "cri-image-hello", "cri-image-preloaded", "workload-up", "cri-workload", "workload-no-pull",
		"cri-pull-served", "cri-image-served", "cri-reload-unpins", "cri-reload-pins", "served-pod-up",
	} {
		requirePass(t, first, name)
	}

	root := mustFind(t, a.disk, "root")
	journal := readJournal(t, root, filepath.Join(filepath.Dir(run.Console), "appliance-journal.txt"))
	for _, want := range []string{"mirror on:", "Ignition finished successfully"} {
		if !strings.Contains(journal, want) {
			t.Errorf("offline journal lacks %q", want)
		}
	}
	if !root.Exists("/var/lib/kiln/firstboot.done") {
		t.Errorf("root:/var/lib/kiln/firstboot.done missing after first boot")
	}

	requireDetail(t, second, "boot", "n=2")
	requireDetail(t, second, "ignition-this-boot", "lines=0")
	for _, name := range []string{
		"firstboot-skipped", "registry-not-started", "no-mirror", "crio-unclean", "restore", "status-images",
		"image-hello", "image-preloaded", "image-served", "run-hello", "run-served", "served-pod-up",
		"crio-after-mount", "cri-image-hello", "cri-image-preloaded", "cri-image-served", "workload-up", "cri-workload", "workload-no-pull",
	} {
		requirePass(t, second, name)
	}
	requireRestored(t, run, second, "crio-unclean", servedRef, a.digests[servedRef])
}

// servedManifest is the served image's pod, outside the kubelet's
// directory: the first boot's script copies it there once it has pulled
// the image through the mirror.
const servedManifest = "/etc/kiln-e2e/served.yaml"

// powerCut is the console line on which the test cuts the power.
const powerCut = "kiln-e2e: cut the power"

// bootWithPowerCut boots disk until the guest powers off, pressing QEMU's
// reset button (a power cut: no shutdown) when its console says "kiln-e2e:
// cut the power"; it returns the whole run and the parts before and after
// the cut.
func bootWithPowerCut(t *testing.T, disk, name string, timeout time.Duration) (run, first, second *vm.Result) {
	t.Helper()
	cuts := 0
	run = vm.Boot(t, disk, vm.WithName(name), vm.WithReboots(), vm.WithTimeout(timeout),
		vm.OnConsole(powerCut, func(m *vm.Monitor, line string) error {
			cuts++
			t.Logf("cutting the power (QEMU system_reset): %s", line)
			return m.Reset()
		}))
	d, _ := run.When("KILN-E2E: boot PASS n=2")
	t.Logf("%s: %s in one QEMU run, the power cut after %s", name, run.Duration.Round(time.Second), d.Round(time.Second))
	if cuts != 1 {
		t.Errorf("the power was cut %d times, want once", cuts)
	}
	return run, run.Until(powerCut), run.After(powerCut)
}

// requireRestored: when CRI-O wiped its store after the power cut (the
// crio-unclean check's detail says), kiln's console line says it restored
// ref by its digest. When CRI-O repaired its store instead, the image must
// simply be there (checked by the image-… checks); the test says so.
func requireRestored(t *testing.T, run, boot *vm.Result, check, ref, digest string) {
	t.Helper()
	c, ok := boot.Check(check)
	if !ok {
		return // reported missing by requirePass
	}
	if !strings.Contains(c.Detail, "wiped=0") {
		want := "kiln: restored " + ref + "@" + digest + " from "
		if _, ok := boot.When(want); !ok {
			t.Errorf("CRI-O wiped its store, and that boot's console lacks %q (console: %s)", want, run.Console)
		}
		return
	}
	t.Logf("CRI-O did not wipe its store after this power cut (it repaired it): %s had nothing to restore of %s", "kiln-restore-images", ref)
}

// TestApplianceFaults damages copies of a built appliance the ways a field
// disk breaks, and requires a clear report and a bounded boot (bad-tree, a
// damaged dm-verity tree, is described at its subtest):
//   - missing-partition: the image partition's GPT entry is deleted
//     (sgdisk -d): the mount gives up, kiln-images-failed.service prints its
//     message on the console and in the journal, nothing hangs.
//   - damaged-blob: bytes flipped inside the served image's layer blob on
//     the partition itself: podman pull fails (never stores wrong bytes) and
//     the registry's journal names the blob.
func TestApplianceFaults(t *testing.T) {
	vm.Schedule(t, 9*time.Minute)
	a := buildAppliance(t, applianceFaultCheck)
	number, guid, offset, size := a.imagePartition(t)

	t.Run("missing-partition", func(t *testing.T) {
		disk := filepath.Join(t.TempDir(), "disk.raw")
		if err := rawdisk.Copy(disk, a.disk); err != nil {
			t.Fatal(err)
		}
		mustRunCmd(t, "sgdisk", "-d", fmt.Sprint(number), disk)
		mustRunCmd(t, "sgdisk", "-v", disk)
		r := vm.Boot(t, disk, vm.WithName("missing-partition"), vm.WithTimeout(applianceTimeout(10*time.Minute)))
		t.Logf("boot without the image partition took %s", r.Duration.Round(time.Second))
		requireAllPass(t, r)
		requireDetail(t, r, "fault", "missing-partition")
		for _, name := range []string{"images-failed-message", "mount-absent", "registry-down", "no-mirror", "no-kiln-jobs", "crio-not-started"} {
			requirePass(t, r, name)
		}
		// CRI-O needs the preloaded store on the partition: systemd says on
		// the console that it did not start, and why.
		// (systemd shortens the unit part to the console width, colours it,
		// and ends it with the description: "Dependency failed for crio…
		// Runtime Interface for OCI (CRI-O).")
		crioDep := false
		for _, l := range r.Lines("Dependency failed for") {
			crioDep = crioDep || strings.Contains(l, "(CRI-O)")
		}
		if !crioDep {
			t.Errorf("console lacks systemd's \"Dependency failed for … (CRI-O)\" line (console: %s)", r.Console)
		}
		// The technician reads it on the console, not only in the journal.
		msg := r.Lines("kiln: the image partition (partition GUID " + strings.ToLower(guid))
		if len(msg) == 0 {
			msg = r.Lines("kiln: the image partition (partition GUID " + guid)
		}
		if len(msg) == 0 {
			t.Errorf("console lacks kiln-images-failed.service's message naming GUID %s (console: %s)", guid, r.Console)
		}
	})

	// bad-tree (issue 9): one byte of the dm-verity hash tree's top block
	// flipped, so the tree no longer matches the root hash in the node's
	// config: the image partition is not mounted, and the technician reads
	// why on the console, as for a missing partition.
	t.Run("bad-tree", func(t *testing.T) {
		disk := filepath.Join(t.TempDir(), "disk.raw")
		if err := rawdisk.Copy(disk, a.disk); err != nil {
			t.Fatal(err)
		}
		at := offset + verityTreeOffset(t, disk, offset) + 4096 + 5 // past the verity superblock: the top hash block
		flipByte(t, disk, at)
		r := vm.Boot(t, disk, vm.WithName("bad-tree"), vm.WithTimeout(applianceTimeout(10*time.Minute)))
		t.Logf("boot with a damaged verity tree took %s", r.Duration.Round(time.Second))
		requireAllPass(t, r)
		requireDetail(t, r, "fault", "bad-tree")
		for _, name := range []string{"images-failed-message", "mount-absent", "registry-down", "no-mirror", "no-kiln-jobs"} {
			requirePass(t, r, name)
		}
		if len(r.Lines("kiln: the image partition (partition GUID "+strings.ToLower(guid))) == 0 {
			t.Errorf("console lacks kiln-images-failed.service's message naming GUID %s (console: %s)", guid, r.Console)
		}
	})

	t.Run("damaged-blob", func(t *testing.T) {
		disk := filepath.Join(t.TempDir(), "disk.raw")
		if err := rawdisk.Copy(disk, a.disk); err != nil {
			t.Fatal(err)
		}
		at := flipBlobOnDisk(t, disk, offset, size, filepath.Join(a.layout, "blobs", "sha256", strings.TrimPrefix(a.layer, "sha256:")))
		t.Logf("flipped a byte of layer %s at disk offset %d", a.layer, at)
		r := vm.Boot(t, disk, vm.WithName("damaged-blob"), vm.WithTimeout(applianceTimeout(12*time.Minute)))
		t.Logf("boot with a damaged blob took %s", r.Duration.Round(time.Second))
		requireAllPass(t, r)
		requireDetail(t, r, "fault", "damaged-blob")
		for _, name := range []string{"mounted", "mirror-on", "pull-refused", "not-stored", "registry-names-blob", "verity-refused", "firstboot-not-done"} {
			requirePass(t, r, name)
		}
	})
}

// flipBlobOnDisk finds the middle of blob's bytes inside the partition at
// [offset, offset+size) of disk (squashfs stores file data uncompressed, so
// the bytes are there verbatim), requires exactly one copy, and flips one
// byte of it in place. It returns the disk offset of the flipped byte.
func flipBlobOnDisk(t *testing.T, disk string, offset, size int64, blob string) int64 {
	t.Helper()
	b, err := os.ReadFile(blob) // a test fixture layer: about a megabyte
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 4096 {
		t.Fatalf("blob %s is only %d bytes", blob, len(b))
	}
	needle := b[len(b)/2 : len(b)/2+256]
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var hits []int64
	const chunk = 4 << 20
	buf := make([]byte, chunk+len(needle))
	for pos := offset; pos < offset+size; pos += chunk {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), offset+size-pos)], pos)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		for i := 0; ; {
			j := bytes.Index(buf[i:n], needle)
			if j < 0 {
				break
			}
			if at := pos + int64(i+j); at < pos+chunk { // overlap: count once
				hits = append(hits, at)
			}
			i += j + 1
		}
	}
	if len(hits) != 1 {
		t.Fatalf("blob %s: its bytes occur %d times on the image partition (want exactly 1; is the squashfs compressed?)", blob, len(hits))
	}
	at := hits[0] + int64(len(needle)/2)
	one := make([]byte, 1)
	if _, err := f.ReadAt(one, at); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0xff
	if _, err := f.WriteAt(one, at); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return at
}

// verityTreeOffset is where the image partition's dm-verity superblock
// starts: right after the squashfs (its bytes_used, 4 KiB aligned).
func verityTreeOffset(t *testing.T, disk string, partOffset int64) int64 {
	t.Helper()
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb := make([]byte, 48)
	if _, err := f.ReadAt(sb, partOffset); err != nil || string(sb[:4]) != "hsqs" {
		t.Fatalf("no squashfs superblock at %d: %v", partOffset, err)
	}
	used := int64(binary.LittleEndian.Uint64(sb[40:48]))
	return (used + 4095) &^ 4095
}

func flipByte(t *testing.T, disk string, at int64) {
	t.Helper()
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	one := make([]byte, 1)
	if _, err := f.ReadAt(one, at); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0xff
	if _, err := f.WriteAt(one, at); err != nil {
		t.Fatal(err)
	}
}

func mustRunCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// applianceTimeout lets KILN_E2E_BOOT_TIMEOUT raise a scenario's bound.
func applianceTimeout(d time.Duration) time.Duration {
	if s := os.Getenv("KILN_E2E_BOOT_TIMEOUT"); s != "" {
		if e, err := time.ParseDuration(s); err == nil && e > d {
			return e
		}
	}
	return d
}

// requirePass fails unless the guest reported name, and reported it PASS.
func requirePass(t *testing.T, r *vm.Result, name string) {
	t.Helper()
	c, ok := r.Check(name)
	if !ok {
		t.Errorf("guest did not report %q (console: %s)", name, r.Console)
		return
	}
	if !c.Pass {
		t.Errorf("guest check %s FAIL %s", name, c.Detail)
	}
}

// buildAppliance writes the hello images, a recipe whose base is the e2e
// fixture and whose Ignition fragment installs script as the guest check,
// and runs the real `kiln build`.
func buildAppliance(t *testing.T, script string, opts ...applianceOption) *appliance {
	t.Helper()
	var o applianceOptions
	for _, opt := range opts {
		opt(&o)
	}
	dir := t.TempDir()
	a := &appliance{
		disk:    filepath.Join(dir, "appliance.raw"),
		kiln:    buildKilnBinary(t, dir),
		layout:  filepath.Join(dir, "oci"),
		digests: map[string]string{},
	}
	base := fixture.Base(t)
	for _, ref := range []string{helloRef, servedRef, preloadedRef} {
		d, err := images.HelloImage(a.layout, ref, "amd64")
		if err != nil {
			t.Fatal(err)
		}
		a.digests[ref] = d
	}

	d, err := addOwnLayer(a.layout, servedRef, a.digests[servedRef])
	if err != nil {
		t.Fatal(err)
	}
	a.digests[servedRef] = d
	_, _, layers, err := images.Blobs(a.layout, servedRef)
	if err != nil || len(layers) < 2 {
		t.Fatalf("layers of %s: %v %v", servedRef, layers, err)
	}
	a.layer = layers[len(layers)-1]

	// The script learns the expected digests from its own text.
	script = strings.NewReplacer(
		"@LAYER_DIGEST@", a.layer,
		"@HELLO_LINE@", images.HelloLine("amd64"),
		"@HELLO_REF@", helloRef, "@HELLO_DIGEST@", a.digests[helloRef],
		"@SERVED_REF@", servedRef, "@SERVED_DIGEST@", a.digests[servedRef],
		"@PRELOADED_REF@", preloadedRef, "@PRELOADED_DIGEST@", a.digests[preloadedRef],
		"@WORKLOAD_POD@", workloadPod, "@PRELOAD_MODE@", o.preloadMode(), "@SERVED_MANIFEST@", servedManifest,
		"@POWER_CUT@", o.powerCutWord(),
	).Replace(script)
	var frag []byte
	cfg := guest.CheckConfig(script)
	// Every upstream resolves to a dead loopback address, on top of the VM
	// having no NIC: only the node's own registry can serve a pull.
	yes := true
	hosts := "127.0.0.1 localhost\n::1 localhost\n" +
		"127.0.0.9 quay.io registry.example.com docker.io registry-1.docker.io\n"
	mode := 0o644
	cfg.Storage.Files = append(cfg.Storage.Files, types.File{
		Node:          types.Node{Path: "/etc/hosts", Overwrite: &yes},
		FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: guest.DataURL(hosts)}},
	})
	// The workload's static pod, the CRI client that checks it, and the
	// served image's pod, which the script starts once it pulled the image.
	addCRIClient(t, &cfg, buildCRICheck(t, dir), helloRef)
	addWorkloadPod(&cfg, helloRef)
	cfg.Storage.Files = append(cfg.Storage.Files, types.File{Node: types.Node{Path: servedManifest},
		FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: guest.DataURL(podManifest("served", servedRef))}}})
	frag, err = guest.Validate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "check.ign"), frag, 0o644); err != nil {
		t.Fatal(err)
	}

	recipe := fmt.Sprintf(`apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: kiln-e2e
version: 0.0.1
arch: amd64
base:
  path: %s
disk:
  size: fit
imagePartition:
  size: auto
images:
  - name: %s
    source: oci:oci:%[2]s
    preload: true
  - name: %s
    source: oci:oci:%[3]s
  - name: %s
    source: oci:oci:%[4]s
    serve: false
    preload: true
registry:
  listen: 127.0.0.1:5050
preload:
  mode: %[5]s
ignition:
  fragments:
    - check.ign
`, base, helloRef, servedRef, preloadedRef, o.preloadMode())
	rp := filepath.Join(dir, "appliance.yaml")
	if err := os.WriteFile(rp, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	cmd := exec.Command(a.kiln, "build", rp, "-o", a.disk, "--cache", filepath.Join(dir, "cache"))
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kiln build: %v\n%s", err, out)
	}
	t.Logf("kiln build took %s", time.Since(start).Round(time.Second))
	a.rebuild(t, rp, filepath.Join(dir, "cache"))

	out, err = exec.Command(a.kiln, "inspect", a.disk, "-o", "json").Output()
	if err != nil {
		t.Fatalf("kiln inspect: %v", err)
	}
	if err := json.Unmarshal(out, &a.info); err != nil {
		t.Fatalf("kiln inspect -o json: %v\n%s", err, out)
	}
	// The lock and the partition must carry the digests the layout has:
	// the guest checks against these.
	if a.info.Contents == nil {
		t.Fatalf("kiln inspect shows no image partition contents:\n%s", out)
	}
	got := map[string]string{}
	for _, im := range a.info.Contents.Images {
		got[im.Name] = im.Digest
	}
	for ref, d := range a.digests {
		if got[ref] != d {
			t.Errorf("kiln.json digest of %s = %q, the layout has %s", ref, got[ref], d)
		}
	}
	lock, err := os.ReadFile(filepath.Join(dir, "appliance.lock"))
	if err != nil {
		t.Fatal(err)
	}
	for ref, d := range a.digests {
		if !bytes.Contains(lock, []byte(d)) {
			t.Errorf("lock file lacks %s's digest %s", ref, d)
		}
	}
	return a
}

// addOwnLayer appends a random layer to the image ref in the OCI layout dir
// and returns its new digest. The hello images share their one layer, which
// the preloaded store already holds, so a pull of the served image would
// fetch no layer at all; with a layer of its own it must fetch one from the
// node's registry (and the damaged-blob fault has a blob only it uses).
func addOwnLayer(dir, ref, digest string) (string, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return "", err
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return "", err
	}
	img, err := p.Image(h)
	if err != nil {
		return "", err
	}
	l, err := random.Layer(512<<10, ggcrtypes.OCILayer)
	if err != nil {
		return "", err
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: l})
	if err != nil {
		return "", err
	}
	if err := p.ReplaceImage(img, match.Annotation(images.RefNameAnnotation, ref),
		layout.WithAnnotations(map[string]string{images.RefNameAnnotation: ref})); err != nil {
		return "", fmt.Errorf("add a layer to %s: %w", ref, err)
	}
	d, err := img.Digest()
	return d.String(), err
}

// buildKilnBinary builds the real kiln binary, static, as a release would,
// with the node's edition (kiln-agent) beside it, which builds then put on
// the image partition, as `make build` does; $KILN_E2E_KILN names a prebuilt
// one instead (CI artifacts, bisecting; a kiln-agent beside it is used).
func buildKilnBinary(t *testing.T, dir string) string {
	t.Helper()
	if p := os.Getenv("KILN_E2E_KILN"); p != "" {
		t.Logf("using kiln binary %s ($KILN_E2E_KILN)", p)
		return p
	}
	out := filepath.Join(dir, "kiln")
	cmd := exec.Command("go", "build", "-tags", "containers_image_openpgp,exclude_graphdriver_btrfs", "-o", out, "./cmd/kiln")
	cmd.Dir = repo.Root()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kiln: %v\n%s", err, msg)
	}
	buildAgent(t, filepath.Join(dir, "kiln-agent"), "")
	return out
}

// buildAgent builds the node's edition of kiln at out, stamped with
// version when it is not "" (kiln --version then says it): a release's own
// agent, which its stick carries.
func buildAgent(t *testing.T, out, version string) string {
	t.Helper()
	ldflags := "-s -w"
	if version != "" {
		ldflags += " -X github.com/kiln-appliance/kiln/internal/version.version=" + version
	}
	cmd := exec.Command("go", "build", "-tags", "containers_image_openpgp,exclude_graphdriver_btrfs,nodeonly", "-ldflags="+ldflags, "-o", out, "./cmd/kiln")
	cmd.Dir = repo.Root()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nodeonly ./cmd/kiln %s: %v\n%s", version, err, msg)
	}
	return out
}

// rebuild builds the recipe again from the warm cache, which copies the
// dm-verity tree the first build kept rather than hashing the partition,
// checks that it is the same disk byte for byte, and boots that one: the
// guest's kernel opens the image partition through the copied tree.
func (a *appliance) rebuild(t *testing.T, recipe, cache string) {
	t.Helper()
	again := a.disk + ".rebuilt"
	cmd := exec.Command(a.kiln, "build", recipe, "-o", again, "--cache", cache)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kiln build again: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "verity tree kept from an earlier build") {
		t.Fatalf("the rebuild from a warm cache hashed its verity tree again:\n%s", out)
	}
	if a1, a2 := treecmp.SHA256File(t, a.disk), treecmp.SHA256File(t, again); a1 != a2 {
		t.Fatalf("the rebuild wrote another disk: %s, first %s", a2, a1)
	}
	if err := os.Rename(again, a.disk); err != nil {
		t.Fatal(err)
	}
}
