//go:build e2e

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

// reflashFailed is the console line a refused or failed reflash starts with
// (kiln agent reflash, on the stick's console); the boot stops there.
const reflashFailed = "reflash FAILED"

// TestReflash: a recovery stick built from the appliance disk, booted with
// a blank target disk attached, writes the target unattended, reads it back
// and powers off; the target alone then boots as the appliance (first boot
// offline, every appliance check), its bytes identical to the factory disk.
// A target too small is refused with nothing written, and a stick whose
// payload has one flipped byte fails its check and says so. The attended
// stick and the one given a target too small carry a Secure Boot factory
// disk and boot under Secure Boot.
func TestReflash(t *testing.T) {
	// A slot while the appliance and the stick are built; each boot below
	// then asks for its own.
	t.Parallel()
	built := vm.Hold(t, 13*time.Minute)
	a := buildAppliance(t, applianceBootCheck)
	dir := filepath.Dir(a.disk)
	stick := filepath.Join(dir, "stick.raw")
	start := time.Now()
	if out, err := exec.Command(a.kiln, "reflash-stick", filepath.Join(dir, "appliance.yaml"), "--disk", a.disk, "-o", stick,
		"--unattended").CombinedOutput(); err != nil {
		t.Fatalf("kiln reflash-stick: %v\n%s", err, out)
	}
	t.Logf("kiln reflash-stick took %s", time.Since(start).Round(time.Second))
	fi, err := os.Stat(a.disk)
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()
	// A Secure Boot factory disk (the A/B base with secureBoot), for the
	// sticks that boot under Secure Boot: attended, target-too-small.
	sb := newUpgradeSet(t, "#!/bin/bash\n#@LIB@\n#@UPGRADE_LIB@\nshutdown_now poweroff\n", upgradeOptions{
		releases:   []upgradeRelease{{"1.0.0", []string{pauseRef, appRepo + ":1.0"}, appRepo + ":1.0", []string{"factory"}, ""}},
		bases:      map[string]string{"1.0.0": fixture.ABBase(t).Path},
		secureBoot: true,
	})
	sbKey := filepath.Join(sb.dir, "sb", "db.key")
	sbInfo, err := os.Stat(sb.disk)
	if err != nil {
		t.Fatal(err)
	}

	built()

	// The three boots run side by side (each on its own copy of the stick:
	// QEMU locks a disk image it writes); the refusals are short.
	t.Run("reflash-then-boot", func(t *testing.T) {
		vm.Schedule(t, 6*time.Minute)
		target := blankDisk(t, size+64<<20)
		res := vm.Boot(t, stick, vm.WithName("reflash"), vm.WithFailOn(reflashFailed),
			vm.WithQEMUArgs("-drive", "if=virtio,format=raw,file="+target), vm.WithTimeout(applianceTimeout(12*time.Minute)))
		t.Logf("reflash boot took %s", res.Duration.Round(time.Second))
		for _, want := range []string{"kiln reflash: will overwrite /dev/vdb", "unattended stick: not asking",
			"read back /dev/vdb: done", "done — remove the stick and power on"} {
			if len(res.Lines(want)) == 0 {
				t.Errorf("console lacks %q (%s)", want, res.Console)
			}
		}
		if got, want := prefixDigest(t, target, size), prefixDigest(t, a.disk, size); got != want {
			t.Fatalf("the target's first %d bytes differ from the factory disk", size)
		}

		first := vm.Boot(t, target, vm.WithName("reflashed-first-boot"), vm.WithTimeout(applianceTimeout(14*time.Minute)))
		t.Logf("reflashed appliance first boot took %s", first.Duration.Round(time.Second))
		requireAllPass(t, first)
		requireDetail(t, first, "boot", "n=1")
		for _, name := range []string{"ignition", "upstreams-dead", "mount-ro", "mount-verity", "registry-ready",
			"image-hello", "image-preloaded", "run-hello", "pull-served", "pins", "firstboot-done", "workload-up"} {
			requirePass(t, first, name)
		}
		_, _, off, n := a.imagePartition(t)
		if got, want := rangeDigest(t, target, off, n), rangeDigest(t, a.disk, off, n); got != want {
			t.Errorf("after its first boot the target's image partition differs from the factory disk's")
		}
	})

	// The attended stick asks once on the serial console; the test types
	// "yes" and Enter as a technician would, only once the question shows.
	t.Run("attended", func(t *testing.T) {
		vm.Schedule(t, 5*time.Minute)
		asking := filepath.Join(t.TempDir(), "stick.raw")
		if out, err := exec.Command(sb.kiln, "reflash-stick", sb.recipes["1.0.0"], "--disk", sb.disk,
			"-o", asking, "--secure-boot-key", sbKey).CombinedOutput(); err != nil {
			t.Fatalf("kiln reflash-stick (attended): %v\n%s", err, out)
		}
		target := blankDisk(t, sbInfo.Size()+64<<20)
		const prompt = `type "yes"`
		asked := false
		res, err := vm.Run(t, asking, vm.WithName("reflash-attended"), vm.WithFailOn(reflashFailed), vm.WithSecureBoot(), vm.WithReboots(),
			vm.WithQEMUArgs("-drive", "if=virtio,format=raw,file="+target), vm.WithTimeout(applianceTimeout(10*time.Minute)),
			vm.OnPrompt(prompt, func(m *vm.Monitor, line string) error {
				asked = true
				t.Logf("console asks: %s", line)
				return m.Type("yes\r")
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("attended reflash boot took %s", res.Duration.Round(time.Second))
		if !asked {
			t.Fatalf("the stick never asked %q (console: %s)", prompt, res.Console)
		}
		for _, want := range []string{"kiln reflash: will overwrite /dev/vd", prompt + " and press Enter to overwrite /dev/vd",
			"write /dev/vd", "read back /dev/vd", "done — remove the stick and power on"} {
			if len(res.Lines(want)) == 0 {
				t.Errorf("console lacks %q (%s)", want, res.Console)
			}
		}
		for _, done := range []string{"write /dev/vd", "read back /dev/vd"} {
			if !anyLineHas(res, done, ": done") {
				t.Errorf("console lacks the %q done line (%s)", done, res.Console)
			}
		}
		if anyLineHas(res, "unattended stick: not asking") {
			t.Errorf("the attended stick did not ask (%s)", res.Console)
		}
		requireEnrolledFirst(t, res, "kiln reflash: will overwrite")
		if got, want := prefixDigest(t, target, sbInfo.Size()), prefixDigest(t, sb.disk, sbInfo.Size()); got != want {
			t.Fatalf("the target's first %d bytes differ from the Secure Boot factory disk", sbInfo.Size())
		}
	})

	// Under Secure Boot, as attended: the agent refuses a target too small.
	t.Run("target-too-small", func(t *testing.T) {
		vm.Schedule(t, 3*time.Minute)
		own := filepath.Join(t.TempDir(), "stick.raw")
		mustKilnCmd(t, sb.kiln, "reflash-stick", sb.recipes["1.0.0"], "--disk", sb.disk, "-o", own, "--unattended",
			"--secure-boot-key", sbKey)
		if out, err := exec.Command(sb.kiln, "inspect", own).CombinedOutput(); err != nil || !strings.Contains(string(out), "Secure Boot: ready") {
			t.Fatalf("kiln inspect of the Secure Boot stick: %v\n%s", err, out)
		}
		target := blankDisk(t, sbInfo.Size()-1<<20)
		res, err := vm.Run(t, own, vm.WithName("reflash-small"), vm.WithFailOn(reflashFailed), vm.WithSecureBoot(), vm.WithReboots(),
			vm.WithQEMUArgs("-drive", "if=virtio,format=raw,file="+target), vm.WithTimeout(applianceTimeout(6*time.Minute)))
		requireRefused(t, res, err, "is too small", "nothing was written")
		requireEnrolledFirst(t, res, reflashFailed)
		requireBlank(t, target)
	})

	t.Run("flipped-payload-byte", func(t *testing.T) {
		vm.Schedule(t, 2*time.Minute)
		bad := filepath.Join(t.TempDir(), "stick.raw")
		mustRunCmd(t, "cp", "--sparse=always", stick, bad)
		flipInPayload(t, a.kiln, bad, a.disk)
		target := blankDisk(t, size+64<<20)
		res, err := vm.Run(t, bad, vm.WithName("reflash-flipped"), vm.WithFailOn(reflashFailed),
			vm.WithQEMUArgs("-drive", "if=virtio,format=raw,file="+target), vm.WithTimeout(applianceTimeout(6*time.Minute)))
		requireRefused(t, res, err, "the stick is damaged", "(chunk 1 of", "use another stick")
		requireBlank(t, target)
	})
}

// requireEnrolledFirst: the stick's systemd-boot enrolled the factory's keys
// before the console showed after. The firmware is then in user mode: what
// boots after the reset is signed for db, or nothing boots.
func requireEnrolledFirst(t *testing.T, res *vm.Result, after string) {
	t.Helper()
	enrol, ok := res.When(`Enrolling secure boot keys from directory: \loader\keys\auto`)
	if later, ok2 := res.When(after); !ok || !ok2 || later < enrol {
		t.Errorf("the stick's systemd-boot did not enrol the keys before %q", after)
	}
}

// anyLineHas: one console line holds every part.
func anyLineHas(res *vm.Result, parts ...string) bool {
	for _, l := range res.All() {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

func blankDisk(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "target.raw")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	return p
}

// requireRefused: the boot stopped on the reflash's failure line, which
// carries every wanted phrase.
func requireRefused(t *testing.T, res *vm.Result, err error, want ...string) {
	t.Helper()
	if res == nil {
		t.Fatal(err)
	}
	if err == nil || !strings.Contains(err.Error(), `console showed "`+reflashFailed+`"`) {
		t.Fatalf("want the boot stopped on %q, got %v (console: %s)", reflashFailed, err, res.Console)
	}
	lines := strings.Join(res.Lines(reflashFailed), "\n")
	t.Logf("console: %s", lines)
	for _, w := range want {
		if !strings.Contains(lines, w) {
			t.Errorf("the failure line lacks %q: %s", w, lines)
		}
	}
}

// requireBlank: not one byte of the target was written.
func requireBlank(t *testing.T, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf, zero := make([]byte, 4<<20), make([]byte, 4<<20)
	for off := int64(0); ; {
		n, err := f.Read(buf)
		if !bytes.Equal(buf[:n], zero[:n]) {
			t.Fatalf("the refused target was written near byte %d", off)
		}
		off += int64(n)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func prefixDigest(t *testing.T, p string, n int64) string { return rangeDigest(t, p, 0, n) }

func rangeDigest(t *testing.T, p string, off, n int64) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, off, n)); err != nil {
		t.Fatal(err)
	}
	return string(h.Sum(nil))
}

// flipInPayload flips one byte of the appliance disk's primary GPT header
// as the stick's payload partition stores it (uncompressed squashfs: the
// disk's bytes appear as they are), so disk.raw's first chunk no longer
// matches the stick's record.
func flipInPayload(t *testing.T, kiln, stick, disk string) {
	t.Helper()
	var info struct {
		Layout struct {
			Partitions []struct {
				Name   string `json:"name"`
				Offset int64  `json:"offset"`
				Size   int64  `json:"size"`
			} `json:"partitions"`
		} `json:"layout"`
	}
	j, err := exec.Command(kiln, "inspect", stick, "-o", "json").Output()
	if err != nil {
		t.Fatalf("kiln inspect %s: %v", stick, err)
	}
	if err := json.Unmarshal(j, &info); err != nil {
		t.Fatal(err)
	}
	var off, size int64 = -1, 0
	for _, p := range info.Layout.Partitions {
		if p.Name == "kiln-reflash" {
			off, size = p.Offset, p.Size
		}
	}
	if off < 0 {
		t.Fatalf("no kiln-reflash partition on %s", stick)
	}
	d, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	header := make([]byte, 92) // the primary GPT header: signature, CRC, disk GUID
	_, err = d.ReadAt(header, 512)
	d.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(stick, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8<<20)
	for pos := off; pos < off+size; pos += int64(len(buf) - len(header)) {
		n, _ := f.ReadAt(buf, pos)
		if i := bytes.Index(buf[:n], header); i >= 0 {
			at := pos + int64(i) + 60 // inside the disk GUID
			b := []byte{buf[i+60] ^ 0xff}
			if _, err := f.WriteAt(b, at); err != nil {
				t.Fatal(err)
			}
			t.Logf("flipped the payload's byte at %d (the appliance disk's byte %d)", at, 512+60)
			return
		}
		if n < len(buf) {
			break
		}
	}
	t.Fatalf("the appliance disk's GPT header is not in %s's payload partition", stick)
}
