package seal_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/internal/disktest"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	. "github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func TestMain(m *testing.M) { fixtures.Main(m) }

const MiB = fixtures.MiB

func mustVerify(t *testing.T, disk string, o VerifyOptions) *Report {
	t.Helper()
	rep, err := Verify(context.Background(), disk, o)
	if err != nil {
		t.Fatalf("verify a good disk: %v", err)
	}
	return rep
}

// scratchCopy reads disk and writes a copy for flipped to change.
func scratchCopy(t *testing.T, disk string) (img []byte, scratch string) {
	t.Helper()
	img, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	scratch = filepath.Join(t.TempDir(), "flipped.raw")
	if err := os.WriteFile(scratch, img, 0o600); err != nil {
		t.Fatal(err)
	}
	return img, scratch
}

// flipped runs Verify on a copy of img with bit flipped and wants an
// error (naming a part), never OK, never a panic (Verify recovers, but
// a recovered panic is a reader bug too).
func flipped(t *testing.T, img []byte, scratch string, bit int64) *VerifyError {
	t.Helper()
	f, err := os.OpenFile(scratch, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{img[bit/8] ^ 1<<(bit%8)}
	f.WriteAt(b, bit/8)
	_, verr := Verify(context.Background(), scratch, VerifyOptions{})
	f.WriteAt(img[bit/8:bit/8+1], bit/8) // restore
	var ve *VerifyError
	if !errors.As(verr, &ve) {
		t.Fatalf("bit %d (byte %d): verify said %v, want a damaged part named", bit, bit/8, verr)
	}
	if strings.Contains(ve.Error(), "reader failed") {
		t.Fatalf("bit %d (byte %d): a reader panicked: %v", bit, bit/8, ve)
	}
	return ve
}

// TestVerifyEveryBit: every bit of the squashfs superblock and of kiln.json,
// and thousands of random bits across every byte kiln wrote, each make
// verify fail naming the part; never OK, never a panic.
func TestVerifyEveryBit(t *testing.T) {
	for _, noVerity := range []bool{false, true} {
		name := map[bool]string{false: "verity", true: "no-verity"}[noVerity]
		t.Run(name, func(t *testing.T) {
			disk, js := disktest.Sealed(t, noVerity)
			rep := mustVerify(t, disk, VerifyOptions{})
			if len(rep.Unchecked) != 0 {
				t.Errorf("a fresh disk has unchecked parts: %v", rep.Unchecked)
			}
			img, scratch := scratchCopy(t, disk)
			l, err := gpt.Inspect(disk)
			if err != nil {
				t.Fatal(err)
			}
			ip, _ := l.Find(contract.PartitionName)
			wantImage := func(ve *VerifyError, what string) {
				if !strings.Contains(ve.Part, "image partition") && ve.Part != "seal" {
					t.Errorf("%s: part %q, want the image partition: %v", what, ve.Part, ve)
				}
			}
			for bit := ip.Offset * 8; bit < (ip.Offset+96)*8; bit++ {
				wantImage(flipped(t, img, scratch, bit), "squashfs superblock")
			}
			if noVerity { // the sha256 path: fewer bits, each costs a hash of the partition
				for range 300 {
					flipped(t, img, scratch, ip.Offset*8+rand.Int64N(ip.Size*8))
				}
				return
			}
			at := bytes.Index(img[ip.Offset:ip.Offset+ip.Size], js)
			if at < 0 {
				t.Fatal("kiln.json not found in the image partition")
			}
			for bit := (ip.Offset + int64(at)) * 8; bit < (ip.Offset+int64(at)+int64(len(js)))*8; bit++ {
				wantImage(flipped(t, img, scratch, bit), "kiln.json")
			}
			// Random bits: a random partition (or the space outside them),
			// then a random byte of it.
			rng := rand.New(rand.NewPCG(1, uint64(len(img))))
			for range 2000 {
				var off, size int64 = 0, int64(len(img))
				if k := rng.IntN(len(l.Partitions) + 1); k < len(l.Partitions) {
					off, size = l.Partitions[k].Offset, l.Partitions[k].Size
				}
				flipped(t, img, scratch, (off+rng.Int64N(size))*8+rng.Int64N(8))
			}
		})
	}
}

// TestVerifyCases: each finding of the audit, and the parts that change
// on the node.
func TestVerifyCases(t *testing.T) {
	disk, _ := disktest.Sealed(t, false)
	other, _ := func() (string, []byte) {
		tree := fixtures.StageTree(t)
		os.WriteFile(filepath.Join(tree, "other"), []byte("another build"), 0o644)
		d := disktest.Disk(t, tree)
		d.Base.Path, d.Geometry.Placement = fixtures.SmallBase(t), partitions.PlaceBeforeRoot
		disk, _ := disktest.Assemble(t, d)
		return disk, nil
	}()
	l, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	ip, _ := l.Find(contract.PartitionName)
	boot, _ := l.Find(bootconfig.Partition)
	size := l.Size
	rep := mustVerify(t, disk, VerifyOptions{})
	v := rep.Seal.Image.Verity
	flip := func(off int64) func(t *testing.T, p string) {
		return func(t *testing.T, p string) { fixtures.FlipByte(t, p, off) }
	}
	for _, c := range []struct {
		name string
		edit func(t *testing.T, p string)
		o    VerifyOptions
		part string // VerifyError.Part contains
		want string // message contains
	}{
		{"backup GPT header", flip(size - 512 + 40), VerifyOptions{}, "backup GPT", "header at LBA"},
		{"backup GPT entries", flip(size - 33*512 + 200), VerifyOptions{}, "backup GPT", "partition entries"},
		{"primary GPT header", flip(512 + 40), VerifyOptions{}, "primary GPT", "CRC"},
		{"primary GPT entries", flip(1024 + 200), VerifyOptions{}, "primary GPT", "partition entries"},
		{"protective MBR", flip(100), VerifyOptions{}, "protective MBR", "differ"},
		{"truncated", func(t *testing.T, p string) { os.Truncate(p, size-MiB) }, VerifyOptions{}, "disk", "truncated"},
		{"data block", flip(ip.Offset + 5*verity.Block + 3), VerifyOptions{}, "image partition", "data block 5 "},
		{"verity tree", flip(ip.Offset + v.HashOffset + verity.Block + 7), VerifyOptions{}, "image partition", "root hash"},
		{"verity superblock", flip(ip.Offset + v.HashOffset + 40), VerifyOptions{}, "image partition", "verity superblock"},
		{"after the verity superblock", flip(ip.Offset + v.HashOffset + 1000), VerifyOptions{}, "image partition", "verity superblock"},
		{"seal", flip(ip.Offset + ip.Size - Size + 20), VerifyOptions{}, "seal", "disk GUID"},
		{"no seal (an older kiln's disk)", func(t *testing.T, p string) {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, Size), ip.Offset+ip.Size-Size); err != nil {
				t.Fatal(err)
			}
		}, VerifyOptions{}, "seal", "without seals"},
		{"boot", flip(boot.Offset + 4*MiB), VerifyOptions{}, "partition 3 (boot)", "--booted"},
		{"another build's image partition", func(t *testing.T, p string) {
			ol, err := gpt.Inspect(other)
			if err != nil {
				t.Fatal(err)
			}
			oip, _ := ol.Find(contract.PartitionName)
			if oip.Size != ip.Size || oip.Offset != ip.Offset {
				t.Fatalf("the other build's image partition is at %d+%d, this one at %d+%d: the swap needs the same place", oip.Offset, oip.Size, ip.Offset, ip.Size)
			}
			fixtures.CopyBytes(t, other, p, ip.Offset, ip.Size)
		}, VerifyOptions{}, "seal", "disk GUID"},
		{"Ignition with another build's root hash", func(t *testing.T, p string) {
			if err := bootconfig.Write(p, boot.Offset, []byte(`{"kiln":"`+strings.Repeat("ab", 32)+`"}`), fixtures.Epoch, ""); err != nil {
				t.Fatal(err)
			}
		}, VerifyOptions{}, "partition 3 (boot)", "differs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "disk.raw")
			fixtures.CopyBytes(t, disk, p, 0, size)
			c.edit(t, p)
			_, err := Verify(context.Background(), p, c.o)
			var ve *VerifyError
			if !errors.As(err, &ve) || !strings.Contains(ve.Part, c.part) || !strings.Contains(ve.Err.Error(), c.want) {
				t.Fatalf("got %v, want part %q and %q", err, c.part, c.want)
			}
		})
	}

	// After first boot: boot and root changed, root grown, the backup GPT
	// at the new end of the disk: what must not change is still checked,
	// the rest is reported.
	t.Run("booted", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "disk.raw")
		fixtures.CopyBytes(t, disk, p, 0, size)
		fixtures.FlipByte(t, p, boot.Offset+4*MiB)
		os.Truncate(p, size+64*MiB)
		if out, err := exec.Command("sgdisk", "-e", "-d", "4", "-n", "4:0:0", "-c", "4:root", "-u", "4:A1B2C3D4-0004-4000-8000-000000000004", p).CombinedOutput(); err != nil {
			t.Fatalf("sgdisk: %v\n%s", err, out)
		}
		rep := mustVerify(t, p, VerifyOptions{Booted: true})
		got := strings.Join(rep.Unchecked, "\n")
		for _, want := range []string{"GPT headers", "partition 3 (boot)", "partition 4 (root)"} {
			if !strings.Contains(got, want) {
				t.Errorf("unchecked parts lack %q:\n%s", want, got)
			}
		}
		if !strings.Contains(strings.Join(rep.Checked, "\n"), "dm-verity") {
			t.Errorf("the image partition was not checked: %v", rep.Checked)
		}
		// Without --booted the same disk fails, naming the GPT.
		if _, err := Verify(context.Background(), p, VerifyOptions{}); err == nil {
			t.Error("a booted disk verified as fresh")
		}
		// And a damaged image partition still fails with --booted.
		fixtures.FlipByte(t, p, ip.Offset+5*verity.Block)
		if _, err := Verify(context.Background(), p, VerifyOptions{Booted: true}); err == nil || !strings.Contains(err.Error(), "data block 5 ") {
			t.Errorf("booted disk with a damaged image partition: %v", err)
		}
	})
}

// TestVerifyVersion1Seal: a disk an older kiln sealed (version 1: plain
// sha256 of each span) still verifies, and still fails where it is changed:
// the root partition, the headroom past the verity tree, a gap outside the
// partitions.
func TestVerifyVersion1Seal(t *testing.T) {
	d := disktest.Disk(t, fixtures.StageTree(t))
	d.Base.Path, d.Geometry.Placement = fixtures.SmallBase(t), partitions.PlaceBeforeRoot
	SealAs(t, 1)
	disk, l := disktest.Assemble(t, d)
	rep := mustVerify(t, disk, VerifyOptions{})
	if rep.Seal.SchemaVersion != 1 {
		t.Fatalf("seal version %d, want the 1 the test asked for", rep.Seal.SchemaVersion)
	}
	root, _ := l.Find("root")
	ip, _ := l.Find(contract.PartitionName)
	v := rep.Seal.Image.Verity
	for name, off := range map[string]int64{
		"root":     root.Offset + MiB + 17,
		"headroom": ip.Offset + v.HashOffset + v.HashSize + 4096 + 3,
		"outside":  34*512 + 100, // between the primary entries and the first partition
	} {
		t.Run(name, func(t *testing.T) {
			c := filepath.Join(t.TempDir(), "disk.raw")
			data, err := os.ReadFile(disk)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(c, data, 0o644); err != nil {
				t.Fatal(err)
			}
			fixtures.FlipByte(t, c, off)
			if _, err := Verify(context.Background(), c, VerifyOptions{}); err == nil {
				t.Fatalf("byte %d flipped (%s): verify said OK", off, name)
			}
		})
	}
}

// TestVerifyHeaderSectors (issue 26, item 8): a byte changed anywhere in
// either GPT header sector fails verify, the reserved rest of the sector
// (bytes 92-511, which the header's CRC does not cover) included; before
// seal version 3 those 2×420 bytes verified as OK. A disk sealed before
// says, in its OK, that they were not checked.
func TestVerifyHeaderSectors(t *testing.T) {
	disk, _ := disktest.Sealed(t, false)
	img, scratch := scratchCopy(t, disk)
	backup := int64(len(img)) - 512
	for _, sector := range []int64{512, backup} {
		for off := sector; off < sector+512; off++ {
			flipped(t, img, scratch, off*8+off%8)
		}
	}

	t.Run("version 2 seal", func(t *testing.T) {
		d := disktest.Disk(t, fixtures.StageTree(t))
		d.Base.Path, d.Geometry.Placement = fixtures.SmallBase(t), partitions.PlaceBeforeRoot
		SealAs(t, 2)
		old, _ := disktest.Assemble(t, d)
		rep := mustVerify(t, old, VerifyOptions{})
		if got := strings.Join(rep.Unchecked, "\n"); !strings.Contains(got, "bytes 92-511 of the GPT header sectors") {
			t.Errorf("a version 2 disk's OK does not say the header sectors' rest is unchecked: %q", got)
		}
		// What version 2 did record still fails.
		fixtures.FlipByte(t, old, 512+40)
		if _, err := Verify(context.Background(), old, VerifyOptions{}); err == nil {
			t.Error("a version 2 disk with its primary GPT header changed verified")
		}
	})

	t.Run("longer file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "disk.raw")
		fixtures.CopyBytes(t, disk, p, 0, int64(len(img)))
		if err := os.Truncate(p, int64(len(img))+4096); err != nil {
			t.Fatal(err)
		}
		rep := mustVerify(t, p, VerifyOptions{})
		if got := strings.Join(rep.Unchecked, "\n"); !strings.Contains(got, "after the end of the disk the build wrote") {
			t.Errorf("bytes appended to the file are not reported: %q", got)
		}
	})
}

// TestTwoImagePartitions (issue 26, item 16): a disk with a second
// partition named kiln-images is refused by inspect and verify, naming
// both, rather than shown with one of them.
func TestTwoImagePartitions(t *testing.T) {
	disk, _ := disktest.Sealed(t, false)
	p := filepath.Join(t.TempDir(), "disk.raw")
	data, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Room for one more partition at the end, and the backup GPT moved there.
	if err := os.Truncate(p, int64(len(data))+4*MiB); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sgdisk", "-e", "-n", "0:0:+1M", "-c", "0:"+contract.PartitionName, p).CombinedOutput(); err != nil {
		t.Fatalf("sgdisk: %v\n%s", err, out)
	}
	want := "are all named " + contract.PartitionName
	if _, err := gpt.Inspect(p); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Inspect: %v, want %q", err, want)
	}
	var ve *VerifyError
	if _, err := Verify(context.Background(), p, VerifyOptions{}); !errors.As(err, &ve) || !strings.Contains(ve.Error(), want) {
		t.Errorf("Verify: %v, want %q", err, want)
	}
}

// Verify shows its reading of the disk as one task, named for the disk, of
// the disk's size, ended with Verify's error.
func TestVerifyProgress(t *testing.T) {
	disk, _ := disktest.Sealed(t, false)
	l, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	var rec taskRecorder
	mustVerify(t, disk, VerifyOptions{Progress: &rec})
	// Every byte but the GPT headers and the seal, read before the task.
	if want := []string{"verify " + disk + " against its seal"}; !slices.Equal(rec.tasks, want) ||
		rec.total != l.Size || rec.done > rec.total || rec.done < rec.total-64<<10 || len(rec.ended) != 1 || rec.ended[0] != nil {
		t.Errorf("tasks %q of %d bytes, %d read, ended %v; want %q of %d, all but the headers read, ended once with nil",
			rec.tasks, rec.total, rec.done, rec.ended, want, l.Size)
	}

	_, scratch := scratchCopy(t, disk)
	ip, _ := l.Find(contract.PartitionName)
	fixtures.FlipByte(t, scratch, ip.Offset+ip.Size/2)
	var damaged taskRecorder
	_, err = Verify(context.Background(), scratch, VerifyOptions{Progress: &damaged})
	if err == nil || len(damaged.ended) != 1 || damaged.ended[0] != err {
		t.Errorf("a damaged disk: Verify said %v, its task ended with %v; want the same error", err, damaged.ended)
	}
}

// taskRecorder records the one task Verify starts.
type taskRecorder struct {
	tasks       []string
	total, done int64
	ended       []error
}

func (r *taskRecorder) Task(name string, total int64) progress.Task {
	r.tasks, r.total = append(r.tasks, name), total
	return r
}

func (r *taskRecorder) Write(p []byte) (int, error) { r.done += int64(len(p)); return len(p), nil }
func (r *taskRecorder) Done(err error)              { r.ended = append(r.ended, err) }
