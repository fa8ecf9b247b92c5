package rawdisk

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// newDisk makes a real GPT disk with an ext4 partition "data" and a FAT
// partition "esp", using the same tools as the base fixture.
func newDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.raw")
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run("truncate", "-s", "64M", disk)
	run("sgdisk", "-n", "1:2048:+16M", "-t", "1:EF00", "-c", "1:esp",
		"-n", "2:0:+32M", "-t", "2:8300", "-c", "2:data", disk)
	esp, data := filepath.Join(dir, "esp.img"), filepath.Join(dir, "data.img")
	run("mkfs.vfat", "-C", esp, "16384")
	run("mmd", "-i", esp, "::/loader")
	conf := filepath.Join(dir, "a.conf")
	if err := os.WriteFile(conf, []byte("title a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run("mcopy", "-i", esp, conf, "::/loader/a.conf")
	run("mkfs.ext4", "-q", "-L", "data", data, "32M")
	run("dd", "if="+esp, "of="+disk, "bs=1M", "seek=1", "conv=notrunc,sparse", "status=none")
	run("dd", "if="+data, "of="+disk, "bs=1M", "seek=17", "conv=notrunc,sparse", "status=none")
	return disk
}

func TestFind(t *testing.T) {
	disk := newDisk(t)
	p, err := Find(disk, "data")
	if err != nil {
		t.Fatal(err)
	}
	if p.Index != 2 || p.Offset != 17<<20 || p.Size != 32<<20 {
		t.Errorf("Find(data) = %+v, want index 2 at 17 MiB, 32 MiB", p)
	}
	if _, err := Find(disk, "nope"); err == nil || !strings.Contains(err.Error(), "have esp, data") {
		t.Errorf("Find(nope) error = %v, want one naming the partitions present", err)
	}
}

func TestExt4RoundTrip(t *testing.T) {
	disk := newDisk(t)
	p, err := Find(disk, "data")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile("/ignition/config.ign", []byte(`{"a":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Replacing an existing file works, and parents are not recreated.
	if err := p.WriteFile("/ignition/config.ign", []byte(`{"b":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := p.ReadFile("/ignition/config.ign")
	if err != nil || string(got) != `{"b":2}` {
		t.Errorf("ReadFile = %q, %v; want {\"b\":2}", got, err)
	}
	if _, err := p.ReadFile("/missing"); err == nil {
		t.Error("ReadFile(/missing) succeeded")
	}
	if !p.Exists("/ignition") || p.Exists("/missing") {
		t.Error("Exists is wrong")
	}
	dst := t.TempDir()
	if err := p.CopyOut("/ignition", dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "ignition", "config.ign")); err != nil || string(b) != `{"b":2}` {
		t.Errorf("CopyOut tree: %q, %v", b, err)
	}
	if out, err := exec.Command("e2fsck", "-fn", p.Disk+"?offset=17825792").CombinedOutput(); err != nil {
		t.Errorf("e2fsck after writes: %v\n%s", err, out)
	}
}

func TestFATList(t *testing.T) {
	disk := newDisk(t)
	p, err := Find(disk, "esp")
	if err != nil {
		t.Fatal(err)
	}
	names, err := p.FATList("/loader")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, "a.conf") {
		t.Errorf("FATList(/loader) = %v, want a.conf", names)
	}
}

// An entry renamed as systemd-boot renames it (a '+' counter in the name)
// is listed under its new name only; a missing one is an error.
func TestFATRename(t *testing.T) {
	disk := newDisk(t)
	p, err := Find(disk, "esp")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.FATRename("/loader/a.conf", "/loader/a+1.conf"); err != nil {
		t.Fatal(err)
	}
	names, err := p.FATList("/loader")
	if err != nil || !slices.Equal(names, []string{"a+1.conf"}) {
		t.Errorf("FATList(/loader) after rename = %v, %v; want [a+1.conf]", names, err)
	}
	if err := p.FATRename("/loader/missing.conf", "/loader/b.conf"); err == nil {
		t.Error("FATRename of a missing file succeeded")
	}
}

func TestCopyKeepsHoles(t *testing.T) {
	disk := newDisk(t)
	dst := filepath.Join(t.TempDir(), "copy.raw")
	if err := Copy(dst, disk); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(disk)
	b, _ := os.ReadFile(dst)
	if string(a) != string(b) {
		t.Fatal("copy differs from source")
	}
}
