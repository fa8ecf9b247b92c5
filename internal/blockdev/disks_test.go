package blockdev

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Disks follows a mount's device to the whole disks under it: a partition
// to its disk, device-mapper (dm-verity, LUKS, LVM) through its slaves. A
// fake sysfs tree stands in for the kernel's, laid out as the kernel does
// (dev/block/MAJ:MIN links into devices/, partitions as subdirectories of
// their disk with a "partition" file, slaves/ links).
func TestDisks(t *testing.T) {
	sys := t.TempDir()
	mk := func(dir string, files ...string) {
		if err := os.MkdirAll(filepath.Join(sys, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			os.WriteFile(filepath.Join(sys, dir, f), []byte("1\n"), 0o644)
		}
	}
	link := func(name, target string) {
		os.MkdirAll(filepath.Join(sys, filepath.Dir(name)), 0o755)
		if err := os.Symlink(filepath.Join(sys, target), filepath.Join(sys, name)); err != nil {
			t.Fatal(err)
		}
	}
	mk("devices/pci/vda")
	mk("devices/pci/vda/vda2", "partition")
	mk("devices/pci/vdb")
	mk("devices/pci/vdb/vdb1", "partition")
	mk("devices/pci/vdc")
	mk("devices/virtual/block/dm-0") // verity over vda2, hash on vdb1
	link("devices/virtual/block/dm-0/slaves/vda2", "devices/pci/vda/vda2")
	link("devices/virtual/block/dm-0/slaves/vdb1", "devices/pci/vdb/vdb1")
	link("dev/block/252:2", "devices/pci/vda/vda2")
	link("dev/block/252:32", "devices/pci/vdc")
	link("dev/block/253:0", "devices/virtual/block/dm-0")

	for _, tc := range []struct {
		majmin string
		want   []string
	}{
		{"252:2", []string{"vda"}},        // a partition: its disk
		{"252:32", []string{"vdc"}},       // a whole disk
		{"253:0", []string{"vda", "vdb"}}, // device-mapper: every disk below
		{"0:42", nil},                     // overlay, tmpfs: no block device
	} {
		got := Disks(sys, tc.majmin)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Disks(%s) = %v, want %v", tc.majmin, got, tc.want)
		}
	}
}

// Mount points with spaces, tabs or backslashes are octal-escaped in
// mountinfo; InUse and the boot-disk rule compare them with real paths.
func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/run/media/USB\040STICK`: "/run/media/USB STICK",
		`/a\011b\134c`:            "/a\tb\\c",
		`/plain`:                  "/plain",
		`/odd\04`:                 `/odd\04`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
