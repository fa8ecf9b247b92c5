package stickwrite

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/internal/progress"
)

// loopDevice attaches a sparse file of size bytes as a loop device (extra
// losetup flags, e.g. --read-only) and returns the device and its file.
func loopDevice(t *testing.T, size int64, flags ...string) (dev, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "stick.raw")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", append([]string{"--find", "--show"}, append(flags, file)...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v\n%s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v\n%s", dev, err, out)
		}
	})
	return dev, file
}

// mounted puts a filesystem on dev and mounts it until the test ends.
func mounted(t *testing.T, dev string) {
	t.Helper()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
}

func writeImage(t *testing.T, size int) (string, []byte) {
	t.Helper()
	data := bytes.Repeat([]byte("kiln write test image "), size/22+1)[:size]
	p := filepath.Join(t.TempDir(), "image.raw")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, data
}

func TestOpenRefusesWhatIsNotABlockDevice(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file.raw")
	os.WriteFile(file, []byte("x"), 0o644)
	for _, tc := range []struct{ path, want string }{
		{file, "is not a block device"},
		{"/dev/null", "is not a block device"},
		{filepath.Join(t.TempDir(), "missing"), "no such file"},
	} {
		if _, err := Open(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s) = %v, want an error containing %q", tc.path, err, tc.want)
		}
	}
}

// Check refuses, before a byte is written, each kind of device the image
// must not go to, and says what to do; a forced, large enough device passes.
func TestCheck(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name      string
		size      int64 // the device's
		need      int64 // the image's
		flags     []string
		removable bool // as sysfs would say of a USB stick (a loop device says not)
		mount     bool
		o         Options
		want      string // "" accepts
	}{
		{name: "removable and large enough", size: 8 * mib, need: 8 * mib, removable: true},
		{name: "not removable, forced", size: 8 * mib, need: 4 * mib, o: Options{Force: true}},
		{name: "not removable", size: 8 * mib, need: 4 * mib, want: "is not a removable device: it may be a disk of this host; check with lsblk that it is the stick, then run again with --force"},
		{name: "too small", size: 8 * mib, need: 8*mib + 1, removable: true, want: "holds 8.0 MiB (8388608 bytes), the image needs 8.0 MiB (8388609 bytes): use a larger stick; nothing was written"},
		{name: "too small, forced", size: 4 * mib, need: 8 * mib, o: Options{Force: true}, want: "use a larger stick"},
		{name: "read-only", size: 8 * mib, need: mib, flags: []string{"--read-only"}, removable: true, want: "is read-only (the stick's write-protect switch, or blockdev --setro)"},
		{name: "mounted", size: 8 * mib, need: mib, mount: true, o: Options{Force: true}, want: "is in use ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, _ := loopDevice(t, tc.size, tc.flags...)
			if tc.mount {
				mounted(t, dev)
			}
			d, err := Open(dev)
			if err != nil {
				t.Fatal(err)
			}
			d.Removable = d.Removable || tc.removable
			err = d.Check(tc.need, tc.o)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check = %v, want an error containing %q", err, tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), dev):
				t.Errorf("the refusal does not name the device %s: %v", dev, err)
			}
		})
	}
}

// Write puts exactly the image's bytes at the start of the device, leaves
// the rest alone and returns the image's sha256, which it read back.
func TestWrite(t *testing.T) {
	image, data := writeImage(t, 3<<20+4096)
	dev, file := loopDevice(t, 8<<20)
	// What follows the image on the device stays as it was.
	tail := []byte("not the image's")
	f, _ := os.OpenFile(file, os.O_RDWR, 0)
	f.WriteAt(tail, int64(len(data)))
	f.Close()
	d, err := Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Write(context.Background(), image, d, progress.Discard())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if want := "sha256:" + hex.EncodeToString(sum[:]); got != want {
		t.Errorf("Write returned %s, the image is %s", got, want)
	}
	written, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(written[:len(data)], data) {
		t.Error("the device does not start with the image's bytes")
	}
	if !bytes.Equal(written[len(data):len(data)+len(tail)], tail) {
		t.Error("Write changed bytes after the image")
	}
}

func TestWriteRefuses(t *testing.T) {
	image, _ := writeImage(t, 4096)
	t.Run("a missing image", func(t *testing.T) {
		dev, _ := loopDevice(t, 1<<20)
		d, err := Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		missing := filepath.Join(t.TempDir(), "missing.raw")
		if _, err := Write(context.Background(), missing, d, progress.Discard()); err == nil || !strings.Contains(err.Error(), missing) {
			t.Fatalf("Write of a missing image = %v, want an error naming it", err)
		}
	})
	t.Run("a mounted device", func(t *testing.T) {
		dev, _ := loopDevice(t, 8<<20)
		mounted(t, dev)
		d, err := Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Write(context.Background(), image, d, progress.Discard()); err == nil || !strings.Contains(err.Error(), "is it mounted or in use?") {
			t.Fatalf("Write to a mounted device = %v, want the O_EXCL refusal", err)
		}
	})
}
