//go:build !nodeonly

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// loopDevice attaches a new file of size bytes (with partition scanning) and
// returns the loop device and its backing file. Loop devices report
// removable 0, so writes need --force.
func loopDevice(t *testing.T, size int64) (dev, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "stick.raw")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	dev = strings.TrimSpace(run(t, "losetup", "--find", "--show", "--partscan", file))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v\n%s", dev, err, out)
		}
	})
	return dev, file
}

func TestWrite(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	disk := filepath.Join(f.dir, "out.raw")
	mustKiln(t, f, "build", f.recipe, "-o", disk)
	fi, err := os.Stat(disk)
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()

	t.Run("writes, reads back, and the device verifies", func(t *testing.T) {
		dev, _ := loopDevice(t, size+8<<20)
		out := mustKiln(t, f, "write", "--force", disk, dev)
		if !strings.Contains(out, "done: "+dev) || !strings.Contains(out, "read back and identical") {
			t.Fatalf("write does not say done:\n%s", out)
		}
		out = mustKiln(t, f, "verify", dev)
		if !strings.Contains(out, "OK (exactly the bytes the build wrote)") {
			t.Fatalf("kiln verify %s after write:\n%s", dev, out)
		}

		// Now mount a partition of it: the whole device is refused, and so
		// is the partition itself (not a whole disk).
		run(t, "partx", "--update", dev)
		layout, err := gpt.Inspect(disk)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := layout.Find(contract.PartitionName)
		part := fmt.Sprintf("%sp%d", dev, p.Number)
		mnt := t.TempDir()
		run(t, "mount", "-t", "squashfs", "-o", "ro", part, mnt)
		defer run(t, "umount", mnt)
		before := sha256File(t, dev)
		out, code := kiln(t, f, "write", "--force", disk, dev)
		if code != 1 || !strings.Contains(out, "is in use") || !strings.Contains(out, "is mounted on "+mnt) || !strings.Contains(out, "umount") {
			t.Fatalf("write to a mounted device: exit %d, want 1 naming the mount\n%s", code, out)
		}
		out, code = kiln(t, f, "write", "--force", disk, part)
		if code != 1 || !strings.Contains(out, "is partition") || !strings.Contains(out, "give the whole device ("+dev+")") {
			t.Fatalf("write to a partition: exit %d, want 1 naming the whole device\n%s", code, out)
		}
		if sha256File(t, dev) != before {
			t.Fatal("a refused write changed the device")
		}
	})

	// Each refusal: exit 1, the message, and the target's bytes unchanged.
	damaged := filepath.Join(f.dir, "damaged.raw")
	run(t, "cp", "--sparse=always", disk, damaged)
	layout, err := gpt.Inspect(damaged)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := layout.Find(contract.PartitionName)
	fd, err := os.OpenFile(damaged, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	fd.ReadAt(b, p.Offset+4096*3)
	b[0] ^= 0xff
	fd.WriteAt(b, p.Offset+4096*3)
	fd.Close()
	plain := filepath.Join(f.dir, "plain.raw")
	if err := os.WriteFile(plain, []byte(strings.Repeat("not a disk ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		target func(t *testing.T) string
		args   []string // before IMAGE DEVICE
		image  string
		want   []string
	}{
		{"not removable, no --force", func(t *testing.T) string { d, _ := loopDevice(t, size); return d }, nil, disk,
			[]string{"is not a removable device", "run again with --force"}},
		{"read-only device", func(t *testing.T) string {
			d, _ := loopDevice(t, size)
			run(t, "blockdev", "--setro", d)
			// The flag outlives losetup --detach: clear it (before the detach).
			t.Cleanup(func() { run(t, "blockdev", "--setrw", d) })
			return d
		}, []string{"--force"}, disk, []string{"is read-only", "write-protect switch"}},
		{"image larger than the device", func(t *testing.T) string { d, _ := loopDevice(t, size-1<<20); return d }, []string{"--force"}, disk,
			[]string{"the image needs", "use a larger stick; nothing was written"}},
		{"not a block device", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "file")
			os.WriteFile(p, []byte("keep me"), 0o644)
			return p
		}, []string{"--force"}, disk, []string{"is not a block device", "/dev/sdb"}},
		{"damaged image", func(t *testing.T) string { d, _ := loopDevice(t, size); return d }, []string{"--force"}, damaged,
			[]string{"not writing " + damaged, "failed verification", "image partition"}},
		{"damaged image, --no-verify does not help", func(t *testing.T) string { d, _ := loopDevice(t, size); return d }, []string{"--force", "--no-verify"}, damaged,
			[]string{"not writing " + damaged, "failed verification"}},
		{"plain file without --no-verify", func(t *testing.T) string { d, _ := loopDevice(t, size); return d }, []string{"--force"}, plain,
			[]string{plain + " is not a kiln disk (kiln build), an upgrade bundle", "so kiln cannot check it: give --no-verify"}},
		// It named a --stick flag kiln bundle does not have (issue 26).
		{"image is a directory", func(t *testing.T) string { d, _ := loopDevice(t, size); return d }, []string{"--force"}, f.dir,
			[]string{"is not a regular file", "an upgrade stick image (kiln bundle -o) or a recovery stick image (kiln reflash-stick -o)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := tc.target(t)
			before := sha256File(t, target)
			out, code := kiln(t, f, append(append([]string{"write"}, tc.args...), tc.image, target)...)
			if code != 1 {
				t.Fatalf("exit %d, want 1\n%s", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if sha256File(t, target) != before {
				t.Error("a refused write changed the target")
			}
		})
	}

	t.Run("plain file with --no-verify is written and read back", func(t *testing.T) {
		dev, _ := loopDevice(t, 1<<20)
		out := mustKiln(t, f, "write", "--force", "--no-verify", plain, dev)
		if !strings.Contains(out, "writing it unchecked") || !strings.Contains(out, "done: "+dev) {
			t.Fatalf("write --no-verify:\n%s", out)
		}
		got := make([]byte, 11000)
		d, _ := os.Open(dev)
		defer d.Close()
		d.ReadAt(got, 0)
		if string(got) != strings.Repeat("not a disk ", 1000) {
			t.Fatal("device does not hold the image")
		}
	})
}

// A bundle stick image is written only with a key that verifies it, and
// the written stick verifies as a bundle.
func TestWriteBundle(t *testing.T) {
	rs := newReleases(t)
	r11 := rs.recipe(t, "acme", "1.1.0", "")
	rs.mustKiln(t, "lock", r11)
	img := filepath.Join(rs.dir, "upgrade.img")
	rs.mustKiln(t, "bundle", r11, "-o", img, "--key", rs.key)
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	// Exactly the image's size: kiln verify checks a stick image's size
	// (on a larger stick it says to read back the image's bytes instead).
	dev, _ := loopDevice(t, fi.Size())
	before := sha256File(t, dev)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no key", nil, 2, "is an upgrade bundle: give the public key(s)"},
		{"wrong key", []string{"--key", rs.otherPub}, 1, "not writing " + img},
	} {
		out, code := rs.kiln(t, append(append([]string{"write", "--force"}, tc.args...), img, dev)...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want %d with %q\n%s", tc.name, code, tc.code, tc.want, out)
		}
	}
	if sha256File(t, dev) != before {
		t.Fatal("a refused write changed the device")
	}
	out := rs.mustKiln(t, "write", "--force", "--key", rs.pub, img, dev)
	if !strings.Contains(out, "done: "+dev) {
		t.Fatalf("write of a bundle stick:\n%s", out)
	}
	out = rs.mustKiln(t, "verify", "--key", rs.pub, dev)
	if !strings.Contains(out, dev+": OK") {
		t.Fatalf("kiln verify %s after write:\n%s", dev, out)
	}
}
