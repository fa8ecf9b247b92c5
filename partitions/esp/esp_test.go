package esp

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// fat makes a FAT filesystem at 1 MiB into a disk file, as on a disk.
func fat(t *testing.T) FS {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "fat.img")
	if out, err := exec.Command("mkfs.vfat", "-C", "-i", "4B494C4E", "--invariant", img, "8192").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.vfat: %v: %s", err, out)
	}
	b, _ := os.ReadFile(img)
	disk := filepath.Join(dir, "disk.raw")
	os.WriteFile(disk, append(make([]byte, 1<<20), b...), 0o644)
	return FS{Disk: disk, Offset: 1 << 20, Epoch: 1700000000}
}

// fsck checks the filesystem with fsck.vfat -n.
func fsck(t *testing.T, f FS) {
	t.Helper()
	b, _ := os.ReadFile(f.Disk)
	img := filepath.Join(t.TempDir(), "fat.img")
	os.WriteFile(img, b[f.Offset:], 0o644)
	if out, err := exec.Command("fsck.vfat", "-n", img).CombinedOutput(); err != nil {
		t.Errorf("fsck.vfat -n: %v\n%s", err, out)
	}
}

func TestRoundTrip(t *testing.T) {
	f := fat(t)
	tmp := t.TempDir()
	if err := f.Write("EFI/Linux/a.efi", []byte("one"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := f.Write("EFI/Linux/b.efi", []byte("two"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := f.Write("EFI/Linux/a.efi", []byte("replaced"), tmp); err != nil {
		t.Fatal(err)
	}
	if got, err := f.Read("EFI/Linux/a.efi", tmp); err != nil || string(got) != "replaced" {
		t.Errorf("read back %q, %v: want the replacement", got, err)
	}
	if names, err := f.List("EFI/Linux"); err != nil || !slices.Equal(names, []string{"a.efi", "b.efi"}) {
		t.Errorf("list %v, %v", names, err)
	}
	if names, err := f.List("EFI"); err != nil || len(names) != 0 {
		t.Errorf("list of a directory holding only a directory: %v, %v", names, err)
	}
	if err := f.Remove("EFI/Linux/b.efi"); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"EFI/Linux/a.efi": true, "EFI/Linux/b.efi": false, "EFI": true, "loader/entries/x.conf": false, "nothing": false} {
		if ok, err := f.Exists(p); err != nil || ok != want {
			t.Errorf("Exists(%s) = %v, %v; want %v", p, ok, err, want)
		}
	}
	if _, err := f.Read("loader/entries/x.conf", tmp); !errors.Is(err, ErrNotExist) {
		t.Errorf("read of a missing file: %v, want ErrNotExist", err)
	}
	if names, err := f.List("loader/entries"); err != nil || names != nil {
		t.Errorf("list of a missing directory: %v, %v", names, err)
	}
	fsck(t, f)
}

// The same writes give the same bytes: every time is Epoch (a second
// apart, so a time taken from the clock would differ).
func TestReproducible(t *testing.T) {
	var disks [][]byte
	for i := range 2 {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond)
		}
		f := fat(t)
		if err := f.Write("loader/keys/acme/db.auth", []byte("auth"), t.TempDir()); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(f.Disk)
		disks = append(disks, b)
	}
	if !bytes.Equal(disks[0], disks[1]) {
		t.Error("two writes of the same files differ")
	}
}

func TestFull(t *testing.T) {
	f := fat(t)
	big := make([]byte, 16<<20)
	err := f.Write("EFI/Linux/big.efi", big, t.TempDir())
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("the ESP is full")) {
		t.Errorf("a file larger than the ESP: %v, want it said the ESP is full", err)
	}
}
