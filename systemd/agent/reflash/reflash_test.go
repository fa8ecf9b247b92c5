package reflash

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

const mib = 1 << 20

// testImage is 20 MiB: 4 MiB of data, 12 MiB of zeros, 4 MiB of data, so
// the zero-skipping path and the written path both run.
func testImage() []byte {
	img := make([]byte, 20*mib)
	rng := rand.NewChaCha8([32]byte{1})
	rng.Read(img[:4*mib])
	rng.Read(img[16*mib:])
	return img
}

// payload writes a stick's payload directory for img.
func payload(t *testing.T, img []byte, rec recovery.Record) string {
	t.Helper()
	dir := t.TempDir()
	c := recovery.NewChunker()
	c.Write(img)
	c.Fill(&rec)
	writeRecord(t, dir, rec)
	if err := os.WriteFile(filepath.Join(dir, recovery.DiskFile), img, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeRecord(t testing.TB, dir string, rec recovery.Record) {
	t.Helper()
	rec.DiskGUID = "00000000-0000-0000-0000-000000000001"
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(dir, recovery.RecordFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// loop attaches a file of size bytes holding data at its start.
func loop(t *testing.T, size int64, data []byte) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	dev := run(t, "losetup", "--find", "--show", file)
	t.Cleanup(func() { exec.Command("losetup", "--detach", dev).Run() })
	return dev
}

// mounted attaches a loop device holding ext4 and mounts it.
func mounted(t *testing.T) (dev, mnt string) {
	t.Helper()
	dev = loop(t, 32*mib, nil)
	run(t, "mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev)
	mnt = t.TempDir()
	// Read-only: a mounted ext4 writes its own metadata, which would blur
	// "the refusal changed nothing".
	run(t, "mount", "-o", "ro,noload", dev, mnt)
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	return dev, mnt
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func digest(t *testing.T, dev string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(dev)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func reflash(t *testing.T, dir string, opts ...Option) (string, int, error) {
	t.Helper()
	var out bytes.Buffer
	powered := 0
	opts = append([]Option{WithConsole(strings.NewReader(""), &out), WithPowerOff(func() error { powered++; return nil })}, opts...)
	err := Run(context.Background(), dir, opts...)
	return out.String(), powered, err
}

func TestReflashWritesReadsBackAndPowersOff(t *testing.T) {
	img := testImage()
	dir := payload(t, img, recovery.Record{})
	// The target held data where the image is zero (written), and zeros
	// elsewhere past it (skipped).
	old := make([]byte, 24*mib)
	copy(old[8*mib:10*mib], bytes.Repeat([]byte("old disk"), mib/4))
	dev := loop(t, 32*mib, old)

	var out bytes.Buffer
	powered := 0
	err := Run(context.Background(), dir, WithCandidates(dev), WithConsole(strings.NewReader("yes\n"), &out),
		WithPowerOff(func() error { powered++; return nil }))
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := make([]byte, len(img))
	f, _ := os.Open(dev)
	defer f.Close()
	if _, err := io.ReadFull(f, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, img) {
		t.Fatal("the target does not hold the image")
	}
	for _, want := range []string{
		"will overwrite " + dev + " (no model, serial no serial, 32.0 MiB)",
		`type "yes" and press Enter`,
		"write " + dev + ": done", "read back " + dev + ": done",
		"8.0 MiB of zeros not written", // 4 MiB chunks: 4–8 and 12–16 read zero, 8–12 held old data
		"done — remove the stick and power on",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, out.String())
		}
	}
	if powered != 1 {
		t.Errorf("powered off %d times, want 1", powered)
	}
}

// Every refusal: the message, no power-off, and the target unchanged.
func TestReflashRefuses(t *testing.T) {
	img := testImage()
	good := payload(t, img, recovery.Record{})
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) (target string, opts []Option)
		dir   string
		want  []string
	}{
		{"target too small", func(t *testing.T) (string, []Option) {
			d := loop(t, 16*mib, []byte("keep"))
			return d, []Option{WithCandidates(d), WithUnattended()}
		}, good, []string{"is too small", "needs at least 20.0 MiB (20971520 bytes)", "nothing was written"}},
		{"two candidates", func(t *testing.T) (string, []Option) {
			a, b := loop(t, 32*mib, nil), loop(t, 32*mib, nil)
			return a, []Option{WithCandidates(a, b), WithUnattended()}
		}, good, []string{"2 disks could be the one to overwrite", "/dev/loop", "by-path", "nothing was written"}},
		{"only the boot disk", func(t *testing.T) (string, []Option) {
			d, mnt := mounted(t)
			return d, []Option{WithCandidates(d), WithBootMounts(mnt), WithUnattended()}
		}, good, []string{"no disk to write the appliance to", "the disk this system booted from", "nothing was written"}},
		{"the rule names a mounted disk", func(t *testing.T) (string, []Option) {
			d, _ := mounted(t)
			return d, []Option{WithTarget(recovery.Target{Path: d}), WithUnattended()}
		}, good, []string{"is in use", "is mounted on", "nothing was written"}},
		{"the rule names the boot disk", func(t *testing.T) (string, []Option) {
			d, mnt := mounted(t)
			return d, []Option{WithTarget(recovery.Target{Path: d}), WithBootMounts(mnt), WithUnattended()}
		}, good, []string{"the disk this system booted from", "refusing to overwrite it"}},
		{"not confirmed", func(t *testing.T) (string, []Option) {
			d := loop(t, 32*mib, []byte("keep"))
			return d, []Option{WithCandidates(d), WithConsole(strings.NewReader("y\n"), io.Discard)}
		}, good, []string{`not confirmed ("y")`, "nothing was written"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, opts := tc.setup(t)
			before := digest(t, target)
			out, powered, err := reflash(t, tc.dir, opts...)
			if err == nil {
				t.Fatalf("no error\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if powered != 0 {
				t.Error("powered off after a refusal")
			}
			if digest(t, target) != before {
				t.Error("a refusal changed the target")
			}
		})
	}
}

// A stick found damaged half-way stops the write before the damaged chunk
// and leaves the target without a partition table: its first chunk, zeroed
// first and written last, reads zero, so nothing can boot half a disk.
func TestReflashDamagedStickLeavesNoPartitionTable(t *testing.T) {
	img := testImage()
	for _, tc := range []struct {
		name string
		at   int64
		want string
	}{
		{"in the first chunk", 17, "bytes 0–4194304 (chunk 1 of 5)"},
		{"in zeros the write would skip", 10*mib + 17, "bytes 8388608–12582912 (chunk 3 of 5)"},
		{"in the last chunk", 20*mib - 1, "bytes 16777216–20971520 (chunk 5 of 5)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := payload(t, img, recovery.Record{})
			f, err := os.OpenFile(filepath.Join(dir, recovery.DiskFile), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			b := []byte{0}
			f.ReadAt(b, tc.at)
			f.WriteAt([]byte{b[0] ^ 1}, tc.at)
			f.Close()
			// The target held an old disk: its own first chunk, then data.
			dev := loop(t, 32*mib, bytes.Repeat([]byte("old disk"), 3*mib))
			out, powered, err := reflash(t, dir, WithCandidates(dev), WithUnattended())
			failedWithHeadZero(t, dev, out, powered, err,
				"the stick is damaged", tc.want, dev+" was left without a partition table", "use another stick")
		})
	}
}

// The boot disk is skipped, not refused, when another disk is there.
func TestReflashSkipsTheBootDisk(t *testing.T) {
	dir := payload(t, testImage(), recovery.Record{Unattended: true})
	boot, mnt := mounted(t)
	blank := loop(t, 32*mib, nil)
	out, _, err := reflash(t, dir, WithCandidates(boot, blank), WithBootMounts(mnt))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "will overwrite "+blank) || !strings.Contains(out, "unattended stick: not asking") {
		t.Fatalf("console:\n%s", out)
	}
}

// A target that does not keep what was written is found by the read-back
// of the region it is in, while later regions are still being written: the
// error names the chunk, and the target's first chunk, written only after
// every other one read back right, is left zero (or, when it is the chunk
// that differs, zeroed again).
func TestReflashReadBackMismatchLeavesNoPartitionTable(t *testing.T) {
	img := testImage()
	for _, tc := range []struct {
		name   string
		region int   // chunks a region
		at     int64 // the byte the target changes after its region is flushed
		want   string
	}{
		{"in skipped zeros of a middle region", 2, 13*mib + 5, "bytes 12582912–16777216 (chunk 4 of 5) does not match"},
		{"in zeros written in a middle region", 1, 9*mib + 1, "bytes 8388608–12582912 (chunk 3 of 5) does not match"},
		{"in data in the last region", 2, 20*mib - 1, "bytes 16777216–20971520 (chunk 5 of 5) does not match"},
		{"in the first chunk, read back last", 2, 17, "bytes 0–4194304 (chunk 1 of 5) does not match"}, // zeroed again
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := payload(t, img, recovery.Record{})
			old := make([]byte, 24*mib)
			copy(old, bytes.Repeat([]byte("old disk"), 12*mib/8)) // an old partition table, old data at 4–12 MiB where the image is zero (written), none at 12–16 MiB (skipped)
			dev := loop(t, 32*mib, old)
			chunk := int(tc.at / recovery.ChunkSize)
			changed := false
			corrupt := func(from, to int) {
				if chunk < from || chunk >= to {
					return
				}
				f, err := os.OpenFile(dev, os.O_WRONLY, 0)
				if err != nil {
					t.Error(err)
					return
				}
				defer f.Close()
				if _, err := f.WriteAt([]byte{0xA5}, tc.at); err != nil {
					t.Error(err)
				}
				if err := f.Sync(); err != nil {
					t.Error(err)
				}
				changed = true
			}
			out, powered, err := reflash(t, dir, WithCandidates(dev), WithUnattended(),
				func(r *reflasher) { r.region, r.beforeReadBack = tc.region, corrupt })
			if !changed {
				t.Fatalf("the hook never ran for chunk %d\n%s", chunk, out)
			}
			failedWithHeadZero(t, dev, out, powered, err, "read back "+dev, tc.want,
				"the disk did not keep what was written", "left without a partition table", "use another disk")
		})
	}
}

// failedWithHeadZero checks a failed reflash: err says each of want, the
// machine stayed on, and the target's first chunk reads zero, so it does
// not look bootable.
func failedWithHeadZero(t *testing.T, dev, out string, powered int, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error\n%s", out)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q: %v", w, err)
		}
	}
	if powered != 0 {
		t.Error("powered off after a failure")
	}
	head := make([]byte, 4*mib)
	g, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := io.ReadFull(g, head); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(head, make([]byte, len(head))) {
		t.Error("the target's first chunk is not zero: it may look bootable")
	}
}
