package partitions

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// smallBase is a CoreOS-like base small enough to verify thousands of times:
// the same four partitions, the ESP without a filesystem (FAT32 needs 33 MiB).
var (
	smallOnce sync.Once
	smallPath string
	smallErr  error
)

func smallBase(t testing.TB) string {
	t.Helper()
	smallOnce.Do(func() {
		smallPath = filepath.Join(bases(t), "small.raw")
		ps := []basedisk.Partition{
			{Name: "BIOS-BOOT", Type: gpt.BIOSBoot, GUID: "A1B2C3D4-0001-4000-8000-000000000001", Size: MiB},
			{Name: "EFI-SYSTEM", Type: gpt.EFISystemPartition, GUID: "A1B2C3D4-0002-4000-8000-000000000002", Size: 2 * MiB},
			{Name: "boot", Type: gpt.LinuxFilesystem, GUID: "A1B2C3D4-0003-4000-8000-000000000003", Size: 8 * MiB, FS: "ext4", Label: "boot"},
			{Name: "root", Type: gpt.LinuxFilesystem, GUID: "A1B2C3D4-0004-4000-8000-000000000004", Size: 8 * MiB, FS: "ext4", Label: "root"},
		}
		smallErr = basedisk.Write(smallPath, basedisk.WithPartitions(ps))
	})
	if smallErr != nil {
		t.Fatal(smallErr)
	}
	return smallPath
}

// testContents is a kiln.json as the builder writes it.
var testContents = contract.Contents{
	SchemaVersion: contract.ContentsVersion, Recipe: "acme-edge", Version: "1.4.0", Arch: "amd64",
	LockDigest: "sha256:" + strings.Repeat("1", 64), Created: epoch,
	Images: []contract.Image{{Name: "quay.io/acme/app:1.2", Digest: "sha256:" + strings.Repeat("a", 64),
		MediaType: "application/vnd.oci.image.manifest.v1+json", Size: 1234, Served: true, ImageID: "sha256:" + strings.Repeat("b", 64)}},
	Files:    []contract.File{{Path: "oci/index.json", Size: 2, Digest: "sha256:" + strings.Repeat("c", 64)}},
	Registry: contract.Registry{Listen: "127.0.0.1:5050", Upstreams: []string{"quay.io"}},
}

// sealedDisk builds a small kiln disk whose tree holds a kiln.json; it
// returns the disk and kiln.json's bytes.
func sealedDisk(t testing.TB, noVerity bool) (string, []byte) {
	t.Helper()
	tree := stageTree(t)
	var js bytes.Buffer
	if err := testContents.Encode(&js); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, contract.ContentsFile), js.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := defaultOpts(t, tree)
	opts.Base, opts.Placement, opts.NoVerity = smallBase(t), PlaceBeforeRoot, noVerity
	disk, _ := assemble(t, opts)
	return disk, js.Bytes()
}

func mustVerify(t *testing.T, disk string, o VerifyOptions) *VerifyReport {
	t.Helper()
	rep, err := VerifyDisk(context.Background(), disk, o)
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

// flipped runs VerifyDisk on a copy of img with bit flipped and wants an
// error (naming a part), never OK, never a panic (VerifyDisk recovers, but
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
	_, verr := VerifyDisk(context.Background(), scratch, VerifyOptions{})
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
			disk, js := sealedDisk(t, noVerity)
			rep := mustVerify(t, disk, VerifyOptions{})
			if len(rep.Unchecked) != 0 {
				t.Errorf("a fresh disk has unchecked parts: %v", rep.Unchecked)
			}
			img, scratch := scratchCopy(t, disk)
			l, err := Inspect(disk)
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
	disk, _ := sealedDisk(t, false)
	other, _ := func() (string, []byte) {
		tree := stageTree(t)
		os.WriteFile(filepath.Join(tree, "other"), []byte("another build"), 0o644)
		opts := defaultOpts(t, tree)
		opts.Base, opts.Placement = smallBase(t), PlaceBeforeRoot
		d, _ := assemble(t, opts)
		return d, nil
	}()
	l, err := Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	ip, _ := l.Find(contract.PartitionName)
	boot, _ := l.Find(BootPartition)
	size := l.Size
	rep := mustVerify(t, disk, VerifyOptions{})
	v := rep.Seal.Image.Verity
	flip := func(off int64) func(t *testing.T, p string) {
		return func(t *testing.T, p string) { flipByte(t, p, off) }
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
		{"data block", flip(ip.Offset + 5*VerityBlock + 3), VerifyOptions{}, "image partition", "data block 5 "},
		{"verity tree", flip(ip.Offset + v.HashOffset + VerityBlock + 7), VerifyOptions{}, "image partition", "root hash"},
		{"verity superblock", flip(ip.Offset + v.HashOffset + 40), VerifyOptions{}, "image partition", "verity superblock"},
		{"after the verity superblock", flip(ip.Offset + v.HashOffset + 1000), VerifyOptions{}, "image partition", "verity superblock"},
		{"seal", flip(ip.Offset + ip.Size - SealSize + 20), VerifyOptions{}, "seal", "disk GUID"},
		{"no seal (an older kiln's disk)", func(t *testing.T, p string) {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, SealSize), ip.Offset+ip.Size-SealSize); err != nil {
				t.Fatal(err)
			}
		}, VerifyOptions{}, "seal", "without seals"},
		{"boot", flip(boot.Offset + 4*MiB), VerifyOptions{}, "partition 3 (boot)", "--booted"},
		{"another build's image partition", func(t *testing.T, p string) {
			ol, err := Inspect(other)
			if err != nil {
				t.Fatal(err)
			}
			oip, _ := ol.Find(contract.PartitionName)
			if oip.Size != ip.Size || oip.Offset != ip.Offset {
				t.Fatalf("the other build's image partition is at %d+%d, this one at %d+%d: the swap needs the same place", oip.Offset, oip.Size, ip.Offset, ip.Size)
			}
			copyBytes(t, other, p, ip.Offset, ip.Size)
		}, VerifyOptions{}, "seal", "disk GUID"},
		{"Ignition with another build's root hash", func(t *testing.T, p string) {
			if err := writeIgnition(p, boot.Offset, []byte(`{"kiln":"`+strings.Repeat("ab", 32)+`"}`), epoch, ""); err != nil {
				t.Fatal(err)
			}
		}, VerifyOptions{}, "partition 3 (boot)", "differs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "disk.raw")
			copyBytes(t, disk, p, 0, size)
			c.edit(t, p)
			_, err := VerifyDisk(context.Background(), p, c.o)
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
		copyBytes(t, disk, p, 0, size)
		flipByte(t, p, boot.Offset+4*MiB)
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
		if _, err := VerifyDisk(context.Background(), p, VerifyOptions{}); err == nil {
			t.Error("a booted disk verified as fresh")
		}
		// And a damaged image partition still fails with --booted.
		flipByte(t, p, ip.Offset+5*VerityBlock)
		if _, err := VerifyDisk(context.Background(), p, VerifyOptions{Booted: true}); err == nil || !strings.Contains(err.Error(), "data block 5 ") {
			t.Errorf("booted disk with a damaged image partition: %v", err)
		}
	})
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// copyBytes copies size bytes at off of src into dst at the same offset.
func copyBytes(t *testing.T, src, dst string, off, size int64) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	buf := make([]byte, size)
	if _, err := in.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	if _, err := out.WriteAt(buf, off); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyVersion1Seal: a disk an older kiln sealed (version 1: plain
// sha256 of each span) still verifies, and still fails where it is changed:
// the root partition, the headroom past the verity tree, a gap outside the
// partitions.
func TestVerifyVersion1Seal(t *testing.T) {
	tree := stageTree(t)
	opts := defaultOpts(t, tree)
	opts.Base, opts.Placement, opts.sealVersion = smallBase(t), PlaceBeforeRoot, 1
	disk, l := assemble(t, opts)
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
			flipByte(t, c, off)
			if _, err := VerifyDisk(context.Background(), c, VerifyOptions{}); err == nil {
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
	disk, _ := sealedDisk(t, false)
	img, scratch := scratchCopy(t, disk)
	backup := int64(len(img)) - 512
	for _, sector := range []int64{512, backup} {
		for off := sector; off < sector+512; off++ {
			flipped(t, img, scratch, off*8+off%8)
		}
	}

	t.Run("version 2 seal", func(t *testing.T) {
		opts := defaultOpts(t, stageTree(t))
		opts.Base, opts.Placement, opts.sealVersion = smallBase(t), PlaceBeforeRoot, 2
		old, _ := assemble(t, opts)
		rep := mustVerify(t, old, VerifyOptions{})
		if got := strings.Join(rep.Unchecked, "\n"); !strings.Contains(got, "bytes 92-511 of the GPT header sectors") {
			t.Errorf("a version 2 disk's OK does not say the header sectors' rest is unchecked: %q", got)
		}
		// What version 2 did record still fails.
		flipByte(t, old, 512+40)
		if _, err := VerifyDisk(context.Background(), old, VerifyOptions{}); err == nil {
			t.Error("a version 2 disk with its primary GPT header changed verified")
		}
	})

	t.Run("longer file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "disk.raw")
		copyBytes(t, disk, p, 0, int64(len(img)))
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
	disk, _ := sealedDisk(t, false)
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
	if _, err := Inspect(p); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Inspect: %v, want %q", err, want)
	}
	var ve *VerifyError
	if _, err := VerifyDisk(context.Background(), p, VerifyOptions{}); !errors.As(err, &ve) || !strings.Contains(ve.Error(), want) {
		t.Errorf("VerifyDisk: %v, want %q", err, want)
	}
}

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r io.ReaderAt
	n atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// TestHashingStopsWhenCancelled (issue 26, item 7): the digests and the
// verity check of kiln verify read a whole disk, for minutes on a large
// one; once the CLI's context is done (Ctrl-C, SIGTERM) they stop at the
// next read instead of hashing to the end.
func TestHashingStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, version := range []int{1, SealVersion} {
		r := &countingReaderAt{r: bytes.NewReader(make([]byte, 128*MiB))}
		if _, err := digestRange(ctx, version, r, 0, 128*MiB); !errors.Is(err, context.Canceled) || r.n.Load() > 0 {
			t.Errorf("seal version %d digest, cancelled: %v after reading %d bytes; want context.Canceled, nothing read", version, err, r.n.Load())
		}
	}
	r := &countingReaderAt{r: bytes.NewReader(make([]byte, 128*MiB))}
	if _, err := checkLevel(ctx, r, 0, 128*MiB/VerityBlock, nil, r, 0); !errors.Is(err, context.Canceled) || r.n.Load() > 0 {
		t.Errorf("verity check, cancelled: %v after reading %d bytes; want context.Canceled, nothing read", err, r.n.Load())
	}
}
