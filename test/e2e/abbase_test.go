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
// from it; Ignition's first boot works as on the base; a counted entry is
// blessed by systemd-bless-boot once the boot completes.
func TestABBase(t *testing.T) {
	vm.Schedule(t, 5*time.Minute)
	ab := fixture.ABBase(t)
	checkABLayout(t, ab.Path)

	disk := t.TempDir() + "/disk.raw"
	if err := rawdisk.Copy(disk, ab.Path); err != nil {
		t.Fatal(err)
	}
	if err := guest.WriteConfig(disk, guest.CheckConfig(abbaseCheck)); err != nil {
		t.Fatal(err)
	}
	first := vm.Boot(t, disk, vm.WithName("ab-first-boot"))
	t.Logf("first boot (Ignition) took %s", first.Duration.Round(time.Second))
	requireAllPass(t, first)
	requireABUsr(t, first, ab)
	requireDetail(t, first, "ignition-finished", "yes")
	requireDetail(t, first, "check-script", "/var/usrlocal/bin/kiln-e2e-check")
	requireDetail(t, first, "boot-entry", bootentry.FileName(fixture.FirstBootEntryID, 0))

	// The release's entry, counted: as the node will write a new release's.
	esp := mustFind(t, disk, "EFI-SYSTEM")
	requireEntries(t, esp, ab.Entry)
	counted := bootentry.FileName(fixture.ABEntryID, 1)
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

func requireEntries(t *testing.T, esp rawdisk.Partition, want ...string) {
	t.Helper()
	got, err := esp.FATList("/" + bootentry.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("ESP /%s = %v, want %v", bootentry.Dir, got, want)
	}
}

// checkABLayout checks the GPT offline: the partitions in order, with the
// Discoverable Partitions Specification's types and the fixture's
// PARTUUIDs, and usr-b empty.
func checkABLayout(t *testing.T, path string) {
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
	parts := pt.(*gpt.Table).Partitions
	var used []*gpt.Partition
	for _, p := range parts {
		if p.Type != gpt.Unused {
			used = append(used, p)
		}
	}
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
