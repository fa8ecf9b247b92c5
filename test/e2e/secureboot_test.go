//go:build e2e

package e2e

import (
	"bytes"
	"debug/pe"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/partitions/esp"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/rawdisk"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

// refusedLoad starts systemd-boot's report of an EFI program it could not
// load; OVMF refuses one that db does not verify with "Access Denied"
// (EFI_ACCESS_DENIED). systemd-boot 252 then exits, and the firmware goes
// on to its next boot option.
const (
	refusedLoad  = "Error loading "
	accessDenied = ": Access Denied"
)

// TestSecureBootRefusals: what someone with the disk for a minute can do to
// a Secure Boot factory disk, and the machine refusing it. Each is a copy
// of one disk (the factory 1.0 of the A/B base, built with secureBoot),
// booted on OVMF's Secure Boot firmware in setup mode: systemd-boot enrols
// the factory's keys and resets the machine, then
//   - tampered-uki: one byte of the kernel inside the signed first-boot UKI
//     changed: the firmware refuses the image, no kernel starts;
//   - plain-entry: a type #1 entry added and made the default, booting the
//     base's own kernel with a /usr root hash of the attacker's (a rebuilt
//     slot's): the firmware refuses the kernel, which db did not sign, so
//     no command line of the attacker's reaches a kernel;
//   - rebuilt-images: the image partition changed and its hash tree made
//     again (veritysetup format), the new root hash written into the
//     Ignition config where the node's unit reads it: the signed first-boot
//     UKI boots, and the node refuses to open the partition, because the
//     signed command line names the factory's root hash.
//
// The appliance boots (the same disk unchanged) in TestABUpgradeReset.
func TestSecureBootRefusals(t *testing.T) {
	vm.Schedule(t, 4*time.Minute)
	ab := fixture.ABBase(t)
	// No scenario script runs: no kernel may start.
	set := newUpgradeSet(t, "#!/bin/bash\n#@LIB@\n#@UPGRADE_LIB@\nshutdown_now poweroff\n", upgradeOptions{
		releases:   []upgradeRelease{{"1.0.0", []string{pauseRef, appRepo + ":1.0"}, appRepo + ":1.0", []string{"factory"}, ""}},
		bases:      map[string]string{"1.0.0": ab.Path},
		secureBoot: true,
	})

	tampered := copyDisk(t, set.disk, "tampered-uki.raw")
	fs := espFS(t, tampered)
	img := filepath.Join(t.TempDir(), "ignition-firstboot.efi")
	if err := fs.CopyOut("EFI/Linux/ignition-firstboot.efi", img); err != nil {
		t.Fatal(err)
	}
	if _, err := uki.Read(img); err != nil {
		t.Fatal(err)
	}
	flipByte(t, img, sectionMiddle(t, img, ".linux"))
	if err := fs.CopyIn(img, "EFI/Linux/ignition-firstboot.efi"); err != nil {
		t.Fatal(err)
	}
	requireFirmwareRefuses(t, tampered, "tampered-uki", `\EFI\Linux\ignition-firstboot.efi`)

	plain := copyDisk(t, set.disk, "plain-entry.raw")
	fs = espFS(t, plain)
	baseESP := espFS(t, ab.Path)
	entry, err := baseESP.Read("loader/entries/"+ab.Entry, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var linux string
	var lines []string
	for _, l := range strings.Split(string(entry), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && f[0] == "linux":
			linux = strings.TrimPrefix(f[1], "/")
		case len(f) == 2 && f[0] == "initrd":
			// The kernel alone is what the firmware is asked to load (and
			// what fits on the ESP beside the UKIs).
			continue
		case len(f) > 1 && f[0] == "options":
			// the attacker's slot: another root hash
			l = "options " + strings.Join(replaceParam(f[1:], "usrhash", strings.Repeat("ab", 32)), " ")
		}
		lines = append(lines, l)
	}
	if linux == "" {
		t.Fatalf("the base's entry %s names no kernel:\n%s", ab.Entry, entry)
	}
	kernel := filepath.Join(t.TempDir(), filepath.Base(linux))
	if err := baseESP.CopyOut(linux, kernel); err != nil {
		t.Fatal(err)
	}
	if err := fs.MkdirAll(filepath.Dir(linux)); err != nil {
		t.Fatal(err)
	}
	if err := fs.CopyIn(kernel, linux); err != nil {
		t.Fatal(err)
	}
	if err := fs.Write("loader/entries/rebuilt.conf", []byte(strings.Join(lines, "\n")), t.TempDir()); err != nil {
		t.Fatal(err)
	}
	loader, err := fs.Read("loader/loader.conf", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var confLines []string
	for _, l := range strings.Split(string(loader), "\n") {
		if strings.HasPrefix(l, "default ") {
			l = "default rebuilt.conf"
		}
		confLines = append(confLines, l)
	}
	if err := fs.Write("loader/loader.conf", []byte(strings.Join(confLines, "\n")), t.TempDir()); err != nil {
		t.Fatal(err)
	}
	requireFirmwareRefuses(t, plain, "plain-entry", `\`+strings.ReplaceAll(linux, "/", `\`))

	rebuilt := copyDisk(t, set.disk, "rebuilt-images.raw")
	signed := firstBootImagesRootHash(t, rebuilt)
	newHash := rebuildImagePartition(t, rebuilt, signed)
	res, err := vm.Run(t, rebuilt, vm.WithName("rebuilt-images"), vm.WithSecureBoot(), vm.WithReboots(),
		vm.WithFailOn(refusedImages), vm.WithTimeout(applianceTimeout(10*time.Minute)))
	if res == nil {
		t.Fatal(err)
	}
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("console showed %q", refusedImages)) {
		t.Fatalf("rebuilt-images: want the boot stopped by %q, got %v (console: %s)", refusedImages, err, res.Console)
	}
	if l := res.Lines(refusedImages); len(l) == 0 || !strings.HasPrefix(l[0], refusedImages+signed+", but this configuration names "+newHash+": refusing to open") {
		t.Errorf("rebuilt-images: the refusal does not name the signed %s and the configured %s: %q", signed, newHash, l)
	}
}

// refusedImages starts the node's refusal of an image partition root hash
// the signed kernel command line does not name (kiln-images-verity.service).
const refusedImages = "kiln: the signed kernel command line names image partition root hash "

// rebuildImagePartition changes one byte of disk's image partition (root
// hash old), formats its dm-verity hash tree again in place, and writes the
// new root hash into the disk's Ignition config instead of old, as someone
// with the disk would to make the node open a partition of their own. It
// returns the new root hash.
func rebuildImagePartition(t *testing.T, disk, old string) string {
	t.Helper()
	boot := mustFind(t, disk, "boot")
	const config = "/ignition/config.ign"
	cfg, err := boot.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--hash-offset=([0-9]+)`).FindSubmatch(cfg)
	if m == nil || !bytes.Contains(cfg, []byte(old)) {
		t.Fatalf("the Ignition config names no image partition hash offset, or not root hash %s", old)
	}
	hashOffset, err := strconv.ParseInt(string(m[1]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	part := mustFind(t, disk, "kiln-images")
	img := filepath.Join(t.TempDir(), "kiln-images.img")
	if out, err := exec.Command("dd", "if="+disk, "of="+img, "bs=1M", "iflag=skip_bytes,count_bytes",
		fmt.Sprintf("skip=%d", part.Offset), fmt.Sprintf("count=%d", part.Size), "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	flipByte(t, img, hashOffset/2)
	out, err := exec.Command("veritysetup", "format", fmt.Sprintf("--hash-offset=%d", hashOffset),
		fmt.Sprintf("--data-blocks=%d", hashOffset/4096), img, img).CombinedOutput()
	if err != nil {
		t.Fatalf("veritysetup format: %v: %s", err, out)
	}
	h := regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`).FindSubmatch(out)
	if h == nil {
		t.Fatalf("veritysetup format printed no root hash: %s", out)
	}
	if out, err := exec.Command("dd", "if="+img, "of="+disk, "bs=1M", "oflag=seek_bytes", "conv=notrunc",
		fmt.Sprintf("seek=%d", part.Offset), "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	if err := boot.WriteFile(config, bytes.ReplaceAll(cfg, []byte(old), h[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	return string(h[1])
}

// requireFirmwareRefuses boots disk under Secure Boot and wants systemd-boot's
// report that the firmware refused to load file, after the enrolment, and
// no kernel started.
func requireFirmwareRefuses(t *testing.T, disk, name, file string) {
	t.Helper()
	res, err := vm.Run(t, disk, vm.WithName(name), vm.WithSecureBoot(), vm.WithReboots(),
		vm.WithFailOn(refusedLoad), vm.WithTimeout(5*time.Minute))
	if res == nil {
		t.Fatal(err) // QEMU did not even start
	}
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("console showed %q", refusedLoad)) {
		t.Fatalf("%s: want the boot stopped by %q, got %v (console: %s)", name, refusedLoad, err, res.Console)
	}
	enrol, ok := res.When(`Enrolling secure boot keys from directory: \loader\keys\auto`)
	if !ok {
		t.Errorf("%s: systemd-boot did not enrol the keys", name)
	}
	refused, ok := res.When(refusedLoad)
	if !ok || refused < enrol {
		t.Errorf("%s: no refusal after the enrolment", name)
	}
	if l := res.Lines(refusedLoad); len(l) == 0 || !strings.Contains(l[0], file+accessDenied) {
		t.Errorf("%s: the refusal is not %q: %q", name, refusedLoad+file+accessDenied, l)
	}
	if l := res.Lines("Linux version"); len(l) > 0 {
		t.Errorf("%s: a kernel started: %s", name, l[0])
	}
}

// sectionMiddle is the file offset of the middle of the PE file's section.
func sectionMiddle(t *testing.T, file, name string) int64 {
	t.Helper()
	f, err := pe.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(name)
	if s == nil {
		t.Fatalf("%s has no %s section", file, name)
	}
	return int64(s.Offset) + int64(s.Size)/2
}

// copyDisk is a copy of disk in the test's directory.
func copyDisk(t *testing.T, disk, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := rawdisk.Copy(p, disk); err != nil {
		t.Fatal(err)
	}
	return p
}

// espFS is the ESP of disk.
func espFS(t *testing.T, disk string) esp.FS {
	t.Helper()
	p := mustFind(t, disk, "EFI-SYSTEM")
	return esp.FS{Disk: disk, Offset: p.Offset}
}

// replaceParam sets name=value among kernel command line fields.
func replaceParam(fields []string, name, value string) []string {
	out := make([]string, 0, len(fields))
	for _, f := range fields {
		if k, _, _ := strings.Cut(f, "="); k == name {
			f = name + "=" + value
		}
		out = append(out, f)
	}
	return out
}
