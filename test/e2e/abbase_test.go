//go:build e2e

package e2e

import (
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/guest"
	"github.com/kiln-appliance/kiln/test/e2e/rawdisk"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

//go:embed testdata/abbase-check.sh
var abbaseCheck string

// TestABBase proves the A/B base fixture boots as issue 23 needs: /usr is
// usr-a's squashfs opened by the initramfs on dm-verity against the root
// hash its boot loader entry names, read-only, and CRI-O and the kubelet run
// from it; Ignition's first boot works as on the base; os-release and jq say
// which release /usr is; a counted entry is blessed by systemd-bless-boot
// once the boot completes. Release 1.1's OS boots in TestABUpgrade (from
// slot b, the same root hash), which needs no boot of its own here.
func TestABBase(t *testing.T) {
	vm.Schedule(t, 7*time.Minute)
	ab := fixture.ABBase(t)
	checkABLayout(t, ab.Path)

	disk := t.TempDir() + "/disk.raw"
	if err := rawdisk.Copy(disk, ab.Path); err != nil {
		t.Fatal(err)
	}
	if err := guest.WriteConfig(disk, guest.CheckConfig(abbaseCheck)); err != nil {
		t.Fatal(err)
	}
	esp := mustFind(t, disk, "EFI-SYSTEM")
	requireEntries(t, esp, bootentry.FileName(fixture.FirstBootEntryID, 0), ab.Entry)
	first := vm.Boot(t, disk, vm.WithName("ab-first-boot"))
	t.Logf("first boot (Ignition) took %s", first.Duration.Round(time.Second))
	requireAllPass(t, first)
	requireABUsr(t, first, ab)
	requireDetail(t, first, "ignition-finished", "yes")
	requireDetail(t, first, "check-script", "/var/usrlocal/bin/kiln-e2e-check")
	requireDetail(t, first, "boot-entry", bootentry.FileName(fixture.FirstBootEntryID, 0))
	requireDetail(t, first, "os-release", "VERSION_ID=12 IMAGE_VERSION=none")
	requireDetail(t, first, "jq", "none")
	requireEntries(t, esp, ab.Entry)

	// The release's entry, counted: as the node will write a new release's.
	counted := bootentry.FileName(strings.TrimSuffix(ab.Entry, bootentry.Suffix), 1)
	if err := esp.FATRename("/"+bootentry.Dir+"/"+ab.Entry, "/"+bootentry.Dir+"/"+counted); err != nil {
		t.Fatal(err)
	}
	second := vm.Boot(t, disk, vm.WithName("ab-counted-boot"))
	t.Logf("second boot (counted entry %s) took %s", counted, second.Duration.Round(time.Second))
	requireAllPass(t, second)
	requireABUsr(t, second, ab)
	requireDetail(t, second, "ignition-finished", "no")
	// systemd-boot 252 names the entry as it found it, counter included
	// (before its own rename to +0-1): the release is ParseFileName's ID.
	requireDetail(t, second, "boot-entry", counted)
	requireDetail(t, second, "bless-status", "good")
	requireEntries(t, esp, ab.Entry) // blessed: the counter is gone
}

// TestABBaseUnbootable: the unbootable release is what a fallback scenario
// needs: the firmware and systemd-boot start its kernel, its initramfs's
// /init prints its line and exits, the kernel panics and, with panic=5 on
// the entry, resets the machine by itself (QEMU's -no-reboot ends the run
// there).
func TestABBaseUnbootable(t *testing.T) {
	vm.Schedule(t, time.Minute)
	ab := fixture.ABBaseRelease(t, fixture.ABReleaseUnbootable)
	checkABLayout(t, ab.Path)
	requireSamePartitions(t, ab.Path, fixture.ABBase(t).Path)
	disk := t.TempDir() + "/disk.raw"
	if err := rawdisk.Copy(disk, ab.Path); err != nil {
		t.Fatal(err)
	}
	res := vm.Boot(t, disk, vm.WithName("ab-unbootable"), vm.WithoutFailOn("Kernel panic"), vm.WithTimeout(5*time.Minute))
	t.Logf("the unbootable release reset the machine after %s", res.Duration.Round(time.Second))
	var last time.Duration
	for _, want := range []string{fixture.HaltInitLine, "Kernel panic - not syncing: Attempted to kill init!",
		"Rebooting in 5 seconds"} {
		at, ok := res.When(want)
		if !ok || at < last {
			t.Fatalf("console lacks %q after the lines before it (console: %s)", want, res.Console)
		}
		last = at
	}
}

// TestABBaseTamperedUsr: one byte of usr-a changed where squashfs never
// looks (the superblock's mkfs_time; unsquashfs still reads the superblock)
// and the initramfs cannot mount /usr: the verity device opens (the hash
// tree matches the entry's root hash) but refuses the changed block, so the
// mount fails and the boot stops in emergency mode.
func TestABBaseTamperedUsr(t *testing.T) {
	vm.Schedule(t, 30*time.Second)
	ab := fixture.ABBase(t)
	disk := t.TempDir() + "/disk.raw"
	if err := rawdisk.Copy(disk, ab.Path); err != nil {
		t.Fatal(err)
	}
	usr := mustFind(t, disk, "usr-a")
	const mkfsTime = 8 // squashfs superblock: magic, inode count, then mkfs_time
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, usr.Offset+mkfsTime); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, usr.Offset+mkfsTime); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Without verity the slot still reads as squashfs.
	slot := t.TempDir() + "/usr-a.sqfs"
	if out, err := exec.Command("dd", "if="+disk, "of="+slot, "bs=1M", "iflag=skip_bytes,count_bytes",
		fmt.Sprintf("skip=%d", usr.Offset), fmt.Sprintf("count=%d", usr.Size), "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	if out, err := exec.Command("unsquashfs", "-s", slot).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs -s on the tampered slot: %v: %s", err, out)
	}
	if err := guest.WriteConfig(disk, guest.CheckConfig(abbaseCheck)); err != nil {
		t.Fatal(err)
	}
	res, err := vm.Run(t, disk, vm.WithName("ab-tampered-usr"), vm.WithTimeout(10*time.Minute))
	if res == nil {
		t.Fatal(err) // QEMU did not even start
	}
	if err == nil || !strings.Contains(err.Error(), `console showed "emergency mode"`) {
		t.Fatalf("boot with a tampered usr-a: %v; want it stopped in emergency mode (console: %s)", err, res.Console)
	}
	t.Logf("tampered boot stopped after %s", res.Duration.Round(time.Second))
	if len(res.Lines(vm.CheckPrefix)) > 0 {
		t.Errorf("the tampered system reached its checks (console: %s)", res.Console)
	}
	// systemd 252 mounts the slot on /sysusr/usr, then binds it on /sysroot/usr.
	if !slices.ContainsFunc(res.Lines("Failed to mount"), func(l string) bool { return strings.Contains(l, "/sysusr/usr") }) {
		t.Errorf("console lacks systemd's line for the failed /sysusr/usr mount (console: %s)", res.Console)
	}
}

// requireSamePartitions: the disks at a and b have the same partitions
// (number, start, size, type, PARTUUID, name).
func requireSamePartitions(t *testing.T, a, b string) {
	t.Helper()
	pa, pb := gptPartitions(t, a), gptPartitions(t, b)
	if len(pa) != len(pb) {
		t.Fatalf("%s has %d partitions, %s %d", a, len(pa), b, len(pb))
	}
	for i := range pa {
		x, y := pa[i], pb[i]
		if x.Start != y.Start || x.Size != y.Size || x.Type != y.Type || x.GUID != y.GUID || x.Name != y.Name {
			t.Errorf("partition %d: %s %s type %s at %d, %d bytes; want %s's: %s %s type %s at %d, %d bytes",
				i+1, x.Name, x.GUID, x.Type, x.Start, x.Size, b, y.Name, y.GUID, y.Type, y.Start, y.Size)
		}
	}
}

// requireABUsr: /usr was usr-a on dm-verity with the entry's root hash.
func requireABUsr(t *testing.T, r *vm.Result, ab fixture.ABDisk) {
	t.Helper()
	requireDetail(t, r, "usr-mount", "/dev/mapper/usr squashfs ro")
	requireDetail(t, r, "usr-verity", ab.RootHash)
	requireDetail(t, r, "usr-data", fixture.UsrAPartUUID)
	requireDetail(t, r, "usr-hash", fixture.UsrAVerityPartUUID)
	requireDetail(t, r, "esp-mount", "vfat "+fixture.ESPPartUUID)
	requireDetail(t, r, "crio-from-usr", "/usr/bin/crio on /dev/mapper/usr")
	requireDetail(t, r, "kubelet-from-usr", "/usr/bin/kubelet on /dev/mapper/usr")
}

// requireEntries: the ESP's entries are want (in any order).
func requireEntries(t *testing.T, esp rawdisk.Partition, want ...string) {
	t.Helper()
	got, err := esp.FATList("/" + bootentry.Dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want = slices.Sorted(slices.Values(want)); !slices.Equal(got, want) {
		t.Errorf("ESP /%s = %v, want %v", bootentry.Dir, got, want)
	}
}

// checkABLayout checks the GPT offline: the partitions in order, with the
// Discoverable Partitions Specification's types and the fixture's
// PARTUUIDs, and usr-b empty.
func checkABLayout(t *testing.T, path string) {
	t.Helper()
	want := []struct {
		name, uuid string
		typ        gpt.Type
	}{
		{"EFI-SYSTEM", fixture.ESPPartUUID, gpt.EFISystemPartition},
		{"boot", fixture.BootPartUUID, gpt.LinuxFilesystem},
		{"usr-a", fixture.UsrAPartUUID, fixture.UsrPartType},
		{"usr-a-verity", fixture.UsrAVerityPartUUID, fixture.UsrVerityPartType},
		{"usr-b", fixture.UsrBPartUUID, fixture.UsrPartType},
		{"usr-b-verity", fixture.UsrBVerityPartUUID, fixture.UsrVerityPartType},
		{"root", fixture.RootPartUUID, gpt.LinuxRootX86_64},
	}
	used := gptPartitions(t, path)
	if len(used) != len(want) {
		t.Fatalf("A/B base has %d partitions, want %d", len(used), len(want))
	}
	for i, w := range want {
		p := used[i]
		if p.Name != w.name || !strings.EqualFold(p.GUID, w.uuid) || !strings.EqualFold(string(p.Type), string(w.typ)) {
			t.Errorf("partition %d = %s %s type %s, want %s %s type %s", i+1, p.Name, p.GUID, p.Type, w.name, w.uuid, w.typ)
		}
	}
	if a, b := used[2].Size, used[4].Size; a != b {
		t.Errorf("usr-a is %d bytes, usr-b %d: want the same", a, b)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 1<<20)
	if _, err := f.ReadAt(head, int64(used[4].Start)*512); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(head, make([]byte, len(head))) {
		t.Error("usr-b's first MiB is not empty")
	}
}

// gptPartitions are the used partitions of the disk at path, in order.
func gptPartitions(t *testing.T, path string) []*gpt.Partition {
	t.Helper()
	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pt, err := d.GetPartitionTable()
	if err != nil {
		t.Fatal(err)
	}
	var used []*gpt.Partition
	for _, p := range pt.(*gpt.Table).Partitions {
		if p.Type != gpt.Unused {
			used = append(used, p)
		}
	}
	return used
}
