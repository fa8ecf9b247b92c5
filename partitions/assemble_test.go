package partitions_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/internal/disktest"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	"github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/loopmount"
	"github.com/kiln-appliance/kiln/test/treecmp"
)

func TestMain(m *testing.M) { fixtures.Main(m) }

// loopMount mounts partition p of the disk read-only with the kernel's
// squashfs driver.
func loopMount(t *testing.T, disk string, p gpt.Partition) string {
	return loopmount.Squashfs(t, disk, p.Offset, p.Size)
}

func TestAssemble(t *testing.T) {
	tree := fixtures.StageTree(t)
	d := disktest.Disk(t, tree)
	rec := &fixtures.Recorder{}
	disk, l := disktest.Assemble(t, d, WithProgress(rec))
	rec.Check(t, map[string]int64{"copy base partitions": 450 * MiB, "write image filesystem": -1})

	out, err := exec.Command("sgdisk", "-v", disk).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "No problems found") {
		t.Fatalf("sgdisk -v: %v\n%s", err, out)
	}
	again, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(again) != fmt.Sprint(l) {
		t.Errorf("Inspect differs from Assemble's layout:\n%+v\n%+v", again, l)
	}
	base, err := gpt.Inspect(d.Base.Path)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Partitions) != len(base.Partitions)+1 {
		t.Fatalf("want %d partitions, got %+v", len(base.Partitions)+1, l.Partitions)
	}
	rep, err := seal.Verify(context.Background(), disk, seal.VerifyOptions{})
	if err != nil {
		t.Fatalf("verify the new disk: %v", err)
	}
	sealed := rep.Seal
	for i, bp := range base.Partitions {
		p := l.Partitions[i]
		if p.Number != bp.Number || p.Name != bp.Name || p.Type != bp.Type || p.GUID != bp.GUID || p.FirstLBA != bp.FirstLBA || p.LastLBA != bp.LastLBA {
			t.Errorf("base partition changed: %+v -> %+v", bp, p)
		}
		if p.Name == bootconfig.Partition {
			continue // holds the Ignition config now; TestReproducible checks it without
		}
		if a, b := fixtures.HashRange(t, d.Base.Path, bp.Offset, bp.Size), fixtures.HashRange(t, disk, p.Offset, p.Size); a != b {
			t.Errorf("partition %d %s: bytes differ from the base", p.Number, p.Name)
		}
	}
	if fixtures.HashRange(t, d.Base.Path, 0, 440) != fixtures.HashRange(t, disk, 0, 440) {
		t.Error("MBR boot code area (bytes 0-439) differs from the base")
	}
	img := l.Partitions[len(l.Partitions)-1]
	last := base.Partitions[len(base.Partitions)-1]
	switch {
	case img.Name != contract.PartitionName, img.Type != contract.PartitionType, img.Filesystem != gpt.FSSquashfs:
		t.Errorf("image partition: %+v", img)
	case sealed.Image.Verity == nil || !strings.HasPrefix(sealed.Image.Verity.RootHash, strings.ToLower(strings.ReplaceAll(img.GUID, "-", ""))):
		t.Errorf("image partition GUID %s is not the start of the verity root hash (%+v)", img.GUID, sealed.Image.Verity)
	case img.Offset%MiB != 0 || img.Size%MiB != 0 || img.Offset < last.Offset+last.Size || img.Offset >= last.Offset+last.Size+MiB:
		t.Errorf("image partition not 1 MiB aligned right after the base: %+v", img)
	}
	fsSize, err := squashfs.Size(disk, img.Offset)
	if err != nil {
		t.Fatal(err)
	}
	if want := alignUp(fsSize*110/100+verity.TreeSize(fsSize/verity.Block)+seal.Size, MiB); img.Size != want {
		t.Errorf("image partition size %d, want %d (fs %d + 10%% + verity tree + seal)", img.Size, want, fsSize)
	}
	if v := sealed.Image.Verity; v == nil || v.HashOffset != fsSize {
		t.Errorf("verity tree not right after the %d-byte filesystem: %+v", fsSize, v)
	} else {
		// veritysetup (what the node runs) accepts the tree and root hash.
		part := filepath.Join(t.TempDir(), "image-partition")
		fixtures.CopyRange(t, disk, img.Offset, img.Size, part)
		if out, err := exec.Command("veritysetup", "verify", part, part, v.RootHash, fmt.Sprintf("--hash-offset=%d", v.HashOffset)).CombinedOutput(); err != nil {
			t.Errorf("veritysetup verify: %v\n%s", err, out)
		}
	}
	fit := alignUp(img.Offset+img.Size+33*512, MiB)
	if l.Size != fit {
		t.Errorf("disk size %d, want fit %d", l.Size, fit)
	}

	// Base filesystems still clean.
	for _, p := range l.Partitions {
		switch p.Filesystem {
		case gpt.FSExt4:
			if out, err := exec.Command("e2fsck", "-fn", fixtures.Ext4(disk, p.Offset)).CombinedOutput(); err != nil {
				t.Errorf("e2fsck %s: %v\n%s", p.Name, err, out)
			}
		case gpt.FSVfat:
			part := filepath.Join(t.TempDir(), "vfat")
			fixtures.CopyRange(t, disk, p.Offset, p.Size, part)
			if out, err := exec.Command("fsck.vfat", "-n", part).CombinedOutput(); err != nil {
				t.Errorf("fsck.vfat %s: %v\n%s", p.Name, err, out)
			}
		}
	}
	got, err := bootconfig.Read(disk)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, fixtures.Ignition) {
		t.Errorf("Ignition read back %q, wrote %q", got, fixtures.Ignition)
	}
	boot, _ := l.Find(bootconfig.Partition)
	for path, mode := range map[string]string{"/ignition": "Mode:  0700", "/ignition/config.ign": "Mode:  0600"} {
		out, _ := exec.Command("debugfs", "-R", "stat "+path, fixtures.Ext4(disk, boot.Offset)).Output()
		if !strings.Contains(string(out), mode) || !strings.Contains(string(out), "User:     0   Group:     0") {
			t.Errorf("%s: want %s, root-owned (as coreos-installer writes it):\n%s", path, mode, out)
		}
	}

	// The kernel mounts the image partition and sees the staged tree.
	mnt := loopMount(t, disk, img)
	fixtures.CompareTrees(t, tree, mnt)
	treecmp.OverlayLayer(t, filepath.Join(mnt, "storage/overlay/l1/diff"))
}

// TestReproducible: same inputs give the same bytes, whatever the base's
// compression; without Ignition the boot partition is untouched too.
func TestReproducible(t *testing.T) {
	tree := fixtures.StageTree(t)
	var first string
	for _, base := range []string{fixtures.Base(t), fixtures.Base(t), fixtures.Compressed(t, "gzip"), fixtures.Compressed(t, "xz"), fixtures.Compressed(t, "zstd")} {
		d := disktest.Disk(t, tree)
		d.Base.Path = base
		disk, _ := disktest.Assemble(t, d)
		sum := fixtures.HashFile(t, disk)
		if first == "" {
			first = sum
		} else if sum != first {
			t.Errorf("%s: disk sha256 %s, first build %s", filepath.Base(base), sum, first)
		}
		os.Remove(disk)
	}

	d := disktest.Disk(t, tree)
	disk, l := disktest.Assemble(t, d, WithIgnition(nil))
	base, _ := gpt.Inspect(d.Base.Path)
	for i, bp := range base.Partitions {
		if fixtures.HashRange(t, d.Base.Path, bp.Offset, bp.Size) != fixtures.HashRange(t, disk, l.Partitions[i].Offset, l.Partitions[i].Size) {
			t.Errorf("partition %s changed without Ignition", bp.Name)
		}
	}
}

// TestErrors: bad input fails with a message that says what to do.
func TestErrors(t *testing.T) {
	tree := fixtures.StageTree(t)
	tmp := t.TempDir()
	corruptGz := filepath.Join(tmp, "corrupt.gz")
	gz, _ := os.ReadFile(fixtures.Compressed(t, "gzip"))
	os.WriteFile(corruptGz, gz[:len(gz)/2], 0o644)
	flipped := append([]byte(nil), gz...)
	flipped[len(flipped)/2] ^= 0xff
	flippedGz := filepath.Join(tmp, "flipped.gz")
	os.WriteFile(flippedGz, flipped, 0o644)
	xzb, _ := os.ReadFile(fixtures.Compressed(t, "xz"))
	truncXz := filepath.Join(tmp, "truncated.xz")
	os.WriteFile(truncXz, xzb[:len(xzb)-100], 0o644)
	notGPT := filepath.Join(tmp, "notgpt.raw")
	os.WriteFile(notGPT, make([]byte, 4*MiB), 0o644)
	raw := fixtures.Base(t)

	for _, tc := range []struct {
		name string
		edit func(*Disk)
		want []string
	}{
		{"disk too small", func(d *Disk) { d.Geometry.DiskSize = 452 * MiB },
			[]string{"disk size 452 MiB is too small", "the base needs 450 MiB, the image partition 5 MiB, so at least 456 MiB", "set disk.size to at least 456 MiB"}},
		{"disk smaller than base", func(d *Disk) { d.Geometry.DiskSize = 100 * MiB },
			[]string{"disk size 100 MiB is too small: the base alone needs 450 MiB"}},
		{"partition too small", func(d *Disk) { d.Geometry.PartitionSize = 1 * MiB },
			[]string{"image partition size 1 MiB is too small", "set imagePartition.size to at least"}},
		{"no boot partition", func(d *Disk) { d.Base.Path = fixtures.NoBoot(t) },
			[]string{`no partition named or labelled "boot"`, `1 "BIOS-BOOT", 2 "EFI-SYSTEM"`, `3 "root"`}},
		{"truncated gzip", func(d *Disk) { d.Base.Path = corruptGz }, []string{"corrupt or truncated"}},
		{"corrupt gzip", func(d *Disk) { d.Base.Path = flippedGz }, []string{"corrupt or truncated"}},
		{"truncated xz", func(d *Disk) { d.Base.Path = truncXz }, []string{"corrupt or truncated", "xz"}},
		{"not GPT", func(d *Disk) { d.Base.Path = notGPT }, []string{"no GPT partition table"}},
		{"wrong digest", func(d *Disk) { d.Base = Base{Path: raw, Digest: "sha256:" + strings.Repeat("0", 64)} },
			[]string{"but the recipe expects sha256:0000", "fix base.digest"}},
		{"bad digest", func(d *Disk) { d.Base.Digest = "md5:abc" }, []string{"sha256:<64 hex digits>"}},
		{"bad compression", func(d *Disk) { d.Image.Compression = "brotli" }, []string{`compression "brotli" is not supported`}},
		{"missing tree", func(d *Disk) { d.Image.Tree = filepath.Join(tmp, "nope") }, []string{"image partition tree"}},
		{"no seed", func(d *Disk) { d.GUIDSeed = nil }, []string{"GUID seed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := disktest.Disk(t, tree)
			tc.edit(&d)
			err := disktest.Try(t, d)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestCancel: cancelling kills mksquashfs, returns ctx.Err() and leaves no
// temp files of ours (the caller's output file is the caller's to remove).
func TestCancel(t *testing.T) {
	tree := t.TempDir()
	chunk := bytes.Repeat([]byte("kiln"), MiB/4)
	for i := 0; i < 400; i++ { // 400 MiB: takes longer than the cancel delay
		if err := os.WriteFile(filepath.Join(tree, fmt.Sprint(i)), chunk, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := disktest.Disk(t, tree)
	// A private TMPDIR (after the shared fixtures exist): other packages'
	// tests, running at the same time, come and go in the shared one.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	out, err := os.CreateTemp(t.TempDir(), "disk-")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Assemble(ctx, out, d, disktest.Ignition)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancel took %s", d)
	}
	if out, _ := exec.Command("pgrep", "-f", "mksquashfs "+tree).Output(); len(out) > 0 {
		t.Errorf("mksquashfs still running: %s", out)
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("stray temp files in TMPDIR: %v", left)
	}
	if _, err := os.Stat(out.Name()); err != nil {
		t.Errorf("caller's output file gone: %v", err)
	}
}

func TestKilnDiskAsBase(t *testing.T) {
	d := disktest.Disk(t, fixtures.StageTree(t))
	disk, _ := disktest.Assemble(t, d)
	d.Base.Path = disk
	if err := disktest.Try(t, d); err == nil || !strings.Contains(err.Error(), "it is a kiln disk, not a base") {
		t.Errorf("got %v", err)
	}
}

// TestRootLast: root moves after the image partition, byte for byte, with
// its number and GUIDs, and is physically last so growpart can grow it.
func TestRootLast(t *testing.T) {
	for _, placement := range []string{PlaceBeforeRoot, PlaceAuto} {
		t.Run(placement, func(t *testing.T) { testRootLast(t, placement) })
	}
}

func testRootLast(t *testing.T, placement string) {
	tree := fixtures.StageTree(t)
	d := disktest.Disk(t, tree)
	d.Base.Path = fixtures.Compressed(t, "zstd") // the move works on a stream too
	d.Geometry.Placement = placement
	disk, l := disktest.Assemble(t, d)
	if out, err := exec.Command("sgdisk", "-v", disk).CombinedOutput(); err != nil || !strings.Contains(string(out), "No problems found") {
		t.Fatalf("sgdisk -v: %v\n%s", err, out)
	}
	base, err := gpt.Inspect(fixtures.Base(t))
	if err != nil {
		t.Fatal(err)
	}
	broot, _ := base.Find("root")
	root, _ := l.Find("root")
	img, _ := l.Find(contract.PartitionName)
	if root.Number != broot.Number || root.GUID != broot.GUID || root.Type != broot.Type || root.Size != broot.Size {
		t.Errorf("root changed: %+v -> %+v", broot, root)
	}
	if img.Offset != broot.Offset || root.Offset != img.Offset+img.Size {
		t.Errorf("want image partition where root was (%d) and root right after it; got image %d+%d, root %d", broot.Offset, img.Offset, img.Size, root.Offset)
	}
	for _, p := range l.Partitions {
		if p.Offset > root.Offset {
			t.Errorf("partition %s after root", p.Name)
		}
	}
	if fixtures.HashRange(t, fixtures.Base(t), broot.Offset, broot.Size) != fixtures.HashRange(t, disk, root.Offset, root.Size) {
		t.Error("root bytes changed in the move")
	}
	if out, err := exec.Command("e2fsck", "-fn", fixtures.Ext4(disk, root.Offset)).CombinedOutput(); err != nil {
		t.Errorf("e2fsck root: %v\n%s", err, out)
	}
	if l.Size != alignUp(root.Offset+root.Size+33*512, MiB) {
		t.Errorf("disk size %d not fit", l.Size)
	}
	fixtures.CompareTrees(t, tree, loopMount(t, disk, *img))
}

// TestAssemble4Kn: a base with 4096-byte sectors (RHCOS metal4k) keeps its
// sector size; sgdisk reads image files as 512-byte disks, so Inspect and
// the kernel (a 4096-byte-sector loop device) check the result.
func TestAssemble4Kn(t *testing.T) {
	base := filepath.Join(t.TempDir(), "base4k.raw")
	if err := basedisk.Write(base, basedisk.WithSectorSize(4096)); err != nil {
		t.Fatal(err)
	}
	tree := fixtures.StageTree(t)
	d := disktest.Disk(t, tree)
	d.Base.Path = base
	disk, l := disktest.Assemble(t, d)
	if l.SectorSize != 4096 {
		t.Fatalf("sector size %d", l.SectorSize)
	}
	if _, err := seal.Verify(context.Background(), disk, seal.VerifyOptions{}); err != nil {
		t.Errorf("verify a 4Kn disk: %v", err)
	}
	b, err := gpt.Inspect(base)
	if err != nil {
		t.Fatal(err)
	}
	for i, bp := range b.Partitions {
		p := l.Partitions[i]
		if p.FirstLBA != bp.FirstLBA || p.GUID != bp.GUID || (p.Name != bootconfig.Partition && fixtures.HashRange(t, base, bp.Offset, bp.Size) != fixtures.HashRange(t, disk, p.Offset, p.Size)) {
			t.Errorf("partition %s changed", p.Name)
		}
	}
	if l.Size != alignUp(l.Partitions[len(l.Partitions)-1].Offset+l.Partitions[len(l.Partitions)-1].Size+5*4096, MiB) {
		t.Errorf("disk size %d not fit", l.Size)
	}
	if got, err := bootconfig.Read(disk); err != nil || !bytes.Equal(got, fixtures.Ignition) {
		t.Errorf("Ignition: %q, %v", got, err)
	}
	// Inspect reads it through a 4096-byte-sector block device too. (The
	// kernel's own GPT parser is not built into this VM's kernel:
	// CONFIG_EFI_PARTITION is off, so `losetup -P` finds no partitions.)
	out, err := exec.Command("losetup", "-r", "-f", "--show", "--sector-size", "4096", disk).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", dev).Run()
	if got, err := gpt.Inspect(dev); err != nil || got.SectorSize != 4096 || len(got.Partitions) != len(l.Partitions) {
		t.Errorf("Inspect(%s): %+v, %v", dev, got, err)
	}
	img, _ := l.Find(contract.PartitionName)
	fixtures.CompareTrees(t, tree, loopMount(t, disk, *img))
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }
