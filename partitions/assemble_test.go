package partitions

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/loopmount"
	"github.com/kiln-appliance/kiln/test/treecmp"
)

const epoch = 1700000000

var (
	baseOnce sync.Once
	baseDir  string
	baseErr  error
)

// bases writes the fixture base disks once per test binary: raw, its
// compressed forms, and one without a boot partition.
func bases(t testing.TB) string {
	t.Helper()
	baseOnce.Do(func() {
		baseDir, baseErr = os.MkdirTemp("", "kiln-partitions-test-")
		if baseErr != nil {
			return
		}
		raw := filepath.Join(baseDir, "base.raw")
		if baseErr = basedisk.Write(raw); baseErr != nil {
			return
		}
		for _, c := range []struct{ format, name string }{{"gzip", "base.raw.gz"}, {"xz", "base.raw.xz"}, {"zstd", "base.raw.zst"}} {
			if baseErr = basedisk.Compress(raw, filepath.Join(baseDir, c.name), c.format); baseErr != nil {
				return
			}
		}
		baseErr = basedisk.Write(filepath.Join(baseDir, "noboot.raw"), basedisk.WithoutBoot())
	})
	if baseErr != nil {
		t.Fatal(baseErr)
	}
	return baseDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if baseDir != "" {
		os.RemoveAll(baseDir)
	}
	os.Exit(code)
}

// stageTree writes a tree with everything overlay layers need.
func stageTree(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "tree")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "oci/blobs/sha256"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "storage/overlay/l1/diff/etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "kiln.json"), []byte(`{"schemaVersion":1}`+"\n"), 0o644))
	for i := 0; i < 50; i++ {
		must(os.WriteFile(filepath.Join(root, fmt.Sprintf("oci/blobs/sha256/%064x", i)), bytes.Repeat([]byte{byte(i)}, i*1000+1), 0o644))
	}
	big := make([]byte, 3*MiB+17) // more than one squashfs block
	for i := range big {
		big[i] = byte(i * 31)
	}
	must(os.WriteFile(filepath.Join(root, "oci/blobs/sha256/big"), big, 0o644))
	diff := filepath.Join(root, "storage/overlay/l1/diff")
	must(os.WriteFile(filepath.Join(diff, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o600))
	must(os.Link(filepath.Join(diff, "etc/passwd"), filepath.Join(diff, "etc/passwd-hardlink")))
	must(os.Symlink("../etc/passwd", filepath.Join(diff, "etc/link")))
	must(unix.Mknod(filepath.Join(diff, "whiteout"), unix.S_IFCHR|0o000, 0))
	must(os.WriteFile(filepath.Join(diff, "ping"), []byte("#!/bin/sh\n"), 0o755))
	// security.capability v2: cap_net_raw (bit 13) permitted+effective.
	capv2 := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	must(unix.Setxattr(filepath.Join(diff, "etc"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(filepath.Join(diff, "etc/passwd"), "user.kiln", []byte("x"), 0))
	must(os.Chown(filepath.Join(diff, "ping"), 1000, 1001))
	// unix.Chmod: os.Chmod takes Go's mode bits, where 0o4000 is not
	// setuid; and chown drops setuid and security.capability, so both last.
	must(unix.Chmod(filepath.Join(diff, "ping"), 0o4755))
	must(unix.Setxattr(filepath.Join(diff, "ping"), "security.capability", capv2, 0))
	must(os.Mkdir(filepath.Join(diff, "tmp"), 0o1777))
	must(unix.Chmod(filepath.Join(diff, "tmp"), 0o1777))
	return root
}

func assemble(t testing.TB, opts AssembleOptions) (string, *Layout) {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "disk-*.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	opts.Output = out
	l, err := Assemble(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return out.Name(), l
}

func defaultOpts(t testing.TB, tree string) AssembleOptions {
	return AssembleOptions{
		Base: filepath.Join(bases(t), "base.raw"), ImageTree: tree, Headroom: 10,
		SourceDateEpoch: epoch, GUIDSeed: []byte("acme-edge 1.4.0"), Placement: PlaceEnd,
		Ignition: StaticIgnition(testIgnition),
	}
}

var testIgnition = []byte(`{"ignition":{"version":"3.3.0"}}` + "\n")

func TestAssemble(t *testing.T) {
	tree := stageTree(t)
	opts := defaultOpts(t, tree)
	rec := &recorder{}
	opts.Progress = rec
	disk, l := assemble(t, opts)
	rec.check(t, map[string]int64{"copy base partitions": 450 * MiB, "write image filesystem": -1})

	out, err := exec.Command("sgdisk", "-v", disk).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "No problems found") {
		t.Fatalf("sgdisk -v: %v\n%s", err, out)
	}
	again, err := Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(again) != fmt.Sprint(l) {
		t.Errorf("Inspect differs from Assemble's layout:\n%+v\n%+v", again, l)
	}
	base, err := Inspect(opts.Base)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Partitions) != len(base.Partitions)+1 {
		t.Fatalf("want %d partitions, got %+v", len(base.Partitions)+1, l.Partitions)
	}
	rep, err := VerifyDisk(context.Background(), disk, VerifyOptions{})
	if err != nil {
		t.Fatalf("verify the new disk: %v", err)
	}
	seal := rep.Seal
	for i, bp := range base.Partitions {
		p := l.Partitions[i]
		if p.Number != bp.Number || p.Name != bp.Name || p.Type != bp.Type || p.GUID != bp.GUID || p.FirstLBA != bp.FirstLBA || p.LastLBA != bp.LastLBA {
			t.Errorf("base partition changed: %+v -> %+v", bp, p)
		}
		if p.Name == BootPartition {
			continue // holds the Ignition config now; TestReproducible checks it without
		}
		if a, b := hashRange(t, opts.Base, bp.Offset, bp.Size), hashRange(t, disk, p.Offset, p.Size); a != b {
			t.Errorf("partition %d %s: bytes differ from the base", p.Number, p.Name)
		}
	}
	if hashRange(t, opts.Base, 0, 440) != hashRange(t, disk, 0, 440) {
		t.Error("MBR boot code area (bytes 0-439) differs from the base")
	}
	img := l.Partitions[len(l.Partitions)-1]
	last := base.Partitions[len(base.Partitions)-1]
	switch {
	case img.Name != contract.PartitionName, img.Type != contract.PartitionType, img.Filesystem != FSSquashfs:
		t.Errorf("image partition: %+v", img)
	case seal.Image.Verity == nil || !strings.HasPrefix(seal.Image.Verity.RootHash, strings.ToLower(strings.ReplaceAll(img.GUID, "-", ""))):
		t.Errorf("image partition GUID %s is not the start of the verity root hash (%+v)", img.GUID, seal.Image.Verity)
	case img.Offset%MiB != 0 || img.Size%MiB != 0 || img.Offset < last.Offset+last.Size || img.Offset >= last.Offset+last.Size+MiB:
		t.Errorf("image partition not 1 MiB aligned right after the base: %+v", img)
	}
	fsSize, err := squashfsSize(disk, img.Offset)
	if err != nil {
		t.Fatal(err)
	}
	if want := alignUp(fsSize*110/100+verityTreeSize(fsSize/VerityBlock)+SealSize, MiB); img.Size != want {
		t.Errorf("image partition size %d, want %d (fs %d + 10%% + verity tree + seal)", img.Size, want, fsSize)
	}
	if v := seal.Image.Verity; v == nil || v.HashOffset != fsSize {
		t.Errorf("verity tree not right after the %d-byte filesystem: %+v", fsSize, v)
	} else {
		// veritysetup (what the node runs) accepts the tree and root hash.
		part := filepath.Join(t.TempDir(), "image-partition")
		copyRange(t, disk, img.Offset, img.Size, part)
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
		case FSExt4:
			if out, err := exec.Command("e2fsck", "-fn", fsSpec(disk, p.Offset)).CombinedOutput(); err != nil {
				t.Errorf("e2fsck %s: %v\n%s", p.Name, err, out)
			}
		case FSVfat:
			part := filepath.Join(t.TempDir(), "vfat")
			copyRange(t, disk, p.Offset, p.Size, part)
			if out, err := exec.Command("fsck.vfat", "-n", part).CombinedOutput(); err != nil {
				t.Errorf("fsck.vfat %s: %v\n%s", p.Name, err, out)
			}
		}
	}
	got, err := ReadIgnition(disk)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, testIgnition) {
		t.Errorf("Ignition read back %q, wrote %q", got, testIgnition)
	}
	boot, _ := l.Find(BootPartition)
	for path, mode := range map[string]string{"/ignition": "Mode:  0700", "/ignition/config.ign": "Mode:  0600"} {
		out, _ := exec.Command("debugfs", "-R", "stat "+path, fsSpec(disk, boot.Offset)).Output()
		if !strings.Contains(string(out), mode) || !strings.Contains(string(out), "User:     0   Group:     0") {
			t.Errorf("%s: want %s, root-owned (as coreos-installer writes it):\n%s", path, mode, out)
		}
	}

	// The kernel mounts the image partition and sees the staged tree.
	mnt := loopMount(t, disk, img)
	compareTrees(t, tree, mnt)
	treecmp.OverlayLayer(t, filepath.Join(mnt, "storage/overlay/l1/diff"))
}

// loopMount mounts partition p of the disk read-only with the kernel's
// squashfs driver.
func loopMount(t *testing.T, disk string, p Partition) string {
	return loopmount.Squashfs(t, disk, p.Offset, p.Size)
}

// compareTrees checks type, mode, owner, size, content, link target,
// device number, link count and xattrs of every entry.
func compareTrees(t *testing.T, want, got string) {
	t.Helper()
	// Every time on disk is SOURCE_DATE_EPOCH (staged times are not).
	filepath.Walk(got, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.ModTime().Unix() != epoch {
			t.Errorf("%s: mtime %d, want SOURCE_DATE_EPOCH %d", p, info.ModTime().Unix(), epoch)
		}
		return err
	})
	treecmp.Compare(t, want, got)
}

func hashRange(t *testing.T, path string, off, size int64) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, off, size)); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func copyRange(t *testing.T, path string, off, size int64, dst string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, io.NewSectionReader(f, off, size)); err != nil {
		t.Fatal(err)
	}
}

// TestReproducible: same inputs give the same bytes, whatever the base's
// compression; without Ignition the boot partition is untouched too.
func TestReproducible(t *testing.T) {
	tree := stageTree(t)
	dir := bases(t)
	var first string
	for _, name := range []string{"base.raw", "base.raw", "base.raw.gz", "base.raw.xz", "base.raw.zst"} {
		opts := defaultOpts(t, tree)
		opts.Base = filepath.Join(dir, name)
		disk, _ := assemble(t, opts)
		sum := hashRange(t, disk, 0, fileSize(t, disk))
		if first == "" {
			first = sum
		} else if sum != first {
			t.Errorf("%s: disk sha256 %s, first build %s", name, sum, first)
		}
		os.Remove(disk)
	}

	opts := defaultOpts(t, tree)
	opts.Ignition = nil
	disk, l := assemble(t, opts)
	base, _ := Inspect(opts.Base)
	for i, bp := range base.Partitions {
		if hashRange(t, opts.Base, bp.Offset, bp.Size) != hashRange(t, disk, l.Partitions[i].Offset, l.Partitions[i].Size) {
			t.Errorf("partition %s changed without Ignition", bp.Name)
		}
	}
}

func fileSize(t *testing.T, p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestErrors: bad input fails with a message that says what to do.
func TestErrors(t *testing.T) {
	tree := stageTree(t)
	dir := bases(t)
	tmp := t.TempDir()
	corruptGz := filepath.Join(tmp, "corrupt.gz")
	gz, _ := os.ReadFile(filepath.Join(dir, "base.raw.gz"))
	os.WriteFile(corruptGz, gz[:len(gz)/2], 0o644)
	flipped := append([]byte(nil), gz...)
	flipped[len(flipped)/2] ^= 0xff
	flippedGz := filepath.Join(tmp, "flipped.gz")
	os.WriteFile(flippedGz, flipped, 0o644)
	xzb, _ := os.ReadFile(filepath.Join(dir, "base.raw.xz"))
	truncXz := filepath.Join(tmp, "truncated.xz")
	os.WriteFile(truncXz, xzb[:len(xzb)-100], 0o644)
	notGPT := filepath.Join(tmp, "notgpt.raw")
	os.WriteFile(notGPT, make([]byte, 4*MiB), 0o644)
	raw := filepath.Join(dir, "base.raw")

	for _, tc := range []struct {
		name string
		edit func(*AssembleOptions)
		want []string
	}{
		{"disk too small", func(o *AssembleOptions) { o.DiskSize = 452 * MiB },
			[]string{"disk size 452 MiB is too small", "the base needs 450 MiB, the image partition 5 MiB, so at least 456 MiB", "set disk.size to at least 456 MiB"}},
		{"disk smaller than base", func(o *AssembleOptions) { o.DiskSize = 100 * MiB },
			[]string{"disk size 100 MiB is too small: the base alone needs 450 MiB"}},
		{"partition too small", func(o *AssembleOptions) { o.PartitionSize = 1 * MiB },
			[]string{"image partition size 1 MiB is too small", "set imagePartition.size to at least"}},
		{"no boot partition", func(o *AssembleOptions) { o.Base = filepath.Join(dir, "noboot.raw") },
			[]string{`no partition named or labelled "boot"`, `1 "BIOS-BOOT", 2 "EFI-SYSTEM"`, `3 "root"`}},
		{"truncated gzip", func(o *AssembleOptions) { o.Base = corruptGz }, []string{"corrupt or truncated"}},
		{"corrupt gzip", func(o *AssembleOptions) { o.Base = flippedGz }, []string{"corrupt or truncated"}},
		{"truncated xz", func(o *AssembleOptions) { o.Base = truncXz }, []string{"corrupt or truncated", "xz"}},
		{"not GPT", func(o *AssembleOptions) { o.Base = notGPT }, []string{"no GPT partition table"}},
		{"wrong digest", func(o *AssembleOptions) { o.Base, o.BaseDigest = raw, "sha256:"+strings.Repeat("0", 64) },
			[]string{"but the recipe expects sha256:0000", "fix base.digest"}},
		{"bad digest", func(o *AssembleOptions) { o.BaseDigest = "md5:abc" }, []string{"sha256:<64 hex digits>"}},
		{"bad compression", func(o *AssembleOptions) { o.Compression = "brotli" }, []string{`compression "brotli" is not supported`}},
		{"missing tree", func(o *AssembleOptions) { o.ImageTree = filepath.Join(tmp, "nope") }, []string{"image partition tree"}},
		{"no seed", func(o *AssembleOptions) { o.GUIDSeed = nil }, []string{"GUID seed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := defaultOpts(t, tree)
			tc.edit(&opts)
			out, err := os.CreateTemp(t.TempDir(), "disk-")
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			opts.Output = out
			_, err = Assemble(context.Background(), opts)
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
	opts := defaultOpts(t, tree)
	// A private TMPDIR (after the shared fixtures exist): other packages'
	// tests, running at the same time, come and go in the shared one.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	out, err := os.CreateTemp(t.TempDir(), "disk-")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	opts.Output = out
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Assemble(ctx, opts)
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

// recorder is a Reporter that remembers what was reported.
type recorder struct {
	mu    sync.Mutex
	tasks []*recTask
}

type recTask struct {
	name  string
	total int64
	done  int64
	ended bool
	err   error
}

func (r *recorder) Task(name string, total int64) Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	task := &recTask{name: name, total: total}
	r.tasks = append(r.tasks, task)
	return &recWriter{r, task}
}

type recWriter struct {
	r *recorder
	t *recTask
}

func (w *recWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	w.t.done += int64(len(p))
	return len(p), nil
}

func (w *recWriter) Done(err error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	w.t.ended, w.t.err = true, err
}

// check wants each named task ended without error, with done bytes equal
// to want (-1: more than zero).
func (r *recorder) check(t *testing.T, want map[string]int64) {
	t.Helper()
	seen := map[string]bool{}
	for _, task := range r.tasks {
		seen[task.name] = true
		if !task.ended || task.err != nil {
			t.Errorf("progress task %q: ended %v, err %v", task.name, task.ended, task.err)
		}
		if w, ok := want[task.name]; ok && (w == -1 && task.done <= 0 || w >= 0 && task.done != w) {
			t.Errorf("progress task %q: %d bytes done (total %d), want %d", task.name, task.done, task.total, w)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no progress task %q", name)
		}
	}
}

// TestWriteIgnitionReplaces: a second config replaces the first; /ignition
// that is not a directory is an error, not a silent no-op.
// baseCopy copies the generated base and finds its boot partition.
func baseCopy(t *testing.T) (string, *Partition) {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "base.raw")
	copyRange(t, filepath.Join(bases(t), "base.raw"), 0, fileSize(t, filepath.Join(bases(t), "base.raw")), disk)
	l, err := Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := bootPartition(l)
	if err != nil {
		t.Fatal(err)
	}
	return disk, boot
}

func TestWriteIgnitionReplaces(t *testing.T) {
	disk, boot := baseCopy(t)
	for _, cfg := range []string{`{"ignition":{"version":"3.3.0"},"first":true}`, `{"ignition":{"version":"3.4.0"}}`} {
		if err := writeIgnition(disk, boot.Offset, []byte(cfg), epoch, ""); err != nil {
			t.Fatal(err)
		}
		got, err := ReadIgnition(disk)
		if err != nil || string(got) != cfg {
			t.Fatalf("read back %q, %v; want %q", got, err, cfg)
		}
	}
	if out, err := exec.Command("e2fsck", "-fn", fsSpec(disk, boot.Offset)).CombinedOutput(); err != nil {
		t.Errorf("e2fsck: %v\n%s", err, out)
	}
	// debugfs quirk check: a file where the directory should be.
	cmd := exec.Command("debugfs", "-w", "-R", "rm /ignition/config.ign", fsSpec(disk, boot.Offset))
	cmd.Run()
	exec.Command("debugfs", "-w", "-R", "rmdir /ignition", fsSpec(disk, boot.Offset)).Run()
	src := filepath.Join(t.TempDir(), "f")
	os.WriteFile(src, []byte("x"), 0o644)
	exec.Command("debugfs", "-w", "-R", "write "+src+" ignition", fsSpec(disk, boot.Offset)).Run()
	if err := writeIgnition(disk, boot.Offset, []byte("{}"), epoch, ""); err == nil || !strings.Contains(err.Error(), "/ignition, but it is a regular file, not a directory") {
		t.Errorf("want an error about /ignition, got %v", err)
	}
}

// Every time the Ignition write stamps is the build's, SOURCE_DATE_EPOCH=0
// too (which e2fsprogs would take for "use the clock"): two writes a clock
// second apart give the same bytes.
func TestWriteIgnitionIsReproducible(t *testing.T) {
	for _, at := range []int64{0, epoch} {
		var sums []string
		for i := 0; i < 2; i++ {
			disk, boot := baseCopy(t)
			if i > 0 {
				time.Sleep(1100 * time.Millisecond) // the clock's second moves on
			}
			if err := writeIgnition(disk, boot.Offset, testIgnition, at, ""); err != nil {
				t.Fatal(err)
			}
			sums = append(sums, hashRange(t, disk, boot.Offset, boot.Size))
		}
		if sums[0] != sums[1] {
			t.Errorf("epoch %d: two writes of the same config differ", at)
		}
	}
}

func TestKilnDiskAsBase(t *testing.T) {
	opts := defaultOpts(t, stageTree(t))
	disk, _ := assemble(t, opts)
	opts.Base = disk
	out, err := os.CreateTemp(t.TempDir(), "disk-")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	opts.Output = out
	if _, err := Assemble(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "it is a kiln disk, not a base") {
		t.Errorf("got %v", err)
	}
}

// TestInspectDamaged: Inspect notices a truncated disk and a broken backup
// GPT, and reads a disk through a block device (size from seeking).
func TestInspectDamaged(t *testing.T) {
	disk, l := assemble(t, defaultOpts(t, stageTree(t)))
	dev, err := exec.Command("losetup", "-r", "-f", "--show", disk).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(dev))
	defer exec.Command("losetup", "-d", loop).Run()
	if got, err := Inspect(loop); err != nil || got.Size != l.Size || len(got.Partitions) != len(l.Partitions) {
		t.Errorf("Inspect(%s) = %+v, %v", loop, got, err)
	}

	truncated := filepath.Join(t.TempDir(), "truncated.raw")
	copyRange(t, disk, 0, l.Size-MiB, truncated)
	if _, err := Inspect(truncated); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated disk: %v", err)
	}

	broken := filepath.Join(t.TempDir(), "broken.raw")
	copyRange(t, disk, 0, l.Size, broken)
	f, err := os.OpenFile(broken, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("XXX"), l.Size-512)
	f.Close()
	if _, err := Inspect(broken); err == nil || !strings.Contains(err.Error(), "no valid backup GPT header") {
		t.Errorf("broken backup: %v", err)
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
	tree := stageTree(t)
	opts := defaultOpts(t, tree)
	opts.Base = filepath.Join(bases(t), "base.raw.zst") // the move works on a stream too
	opts.Placement = placement
	disk, l := assemble(t, opts)
	if out, err := exec.Command("sgdisk", "-v", disk).CombinedOutput(); err != nil || !strings.Contains(string(out), "No problems found") {
		t.Fatalf("sgdisk -v: %v\n%s", err, out)
	}
	base, err := Inspect(filepath.Join(bases(t), "base.raw"))
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
	if hashRange(t, filepath.Join(bases(t), "base.raw"), broot.Offset, broot.Size) != hashRange(t, disk, root.Offset, root.Size) {
		t.Error("root bytes changed in the move")
	}
	if out, err := exec.Command("e2fsck", "-fn", fsSpec(disk, root.Offset)).CombinedOutput(); err != nil {
		t.Errorf("e2fsck root: %v\n%s", err, out)
	}
	if l.Size != alignUp(root.Offset+root.Size+33*512, MiB) {
		t.Errorf("disk size %d not fit", l.Size)
	}
	compareTrees(t, tree, loopMount(t, disk, *img))
}

// TestAssemble4Kn: a base with 4096-byte sectors (RHCOS metal4k) keeps its
// sector size; sgdisk reads image files as 512-byte disks, so Inspect and
// the kernel (a 4096-byte-sector loop device) check the result.
func TestAssemble4Kn(t *testing.T) {
	base := filepath.Join(t.TempDir(), "base4k.raw")
	if err := basedisk.Write(base, basedisk.WithSectorSize(4096)); err != nil {
		t.Fatal(err)
	}
	tree := stageTree(t)
	opts := defaultOpts(t, tree)
	opts.Base = base
	disk, l := assemble(t, opts)
	if l.SectorSize != 4096 {
		t.Fatalf("sector size %d", l.SectorSize)
	}
	if _, err := VerifyDisk(context.Background(), disk, VerifyOptions{}); err != nil {
		t.Errorf("verify a 4Kn disk: %v", err)
	}
	b, err := Inspect(base)
	if err != nil {
		t.Fatal(err)
	}
	for i, bp := range b.Partitions {
		p := l.Partitions[i]
		if p.FirstLBA != bp.FirstLBA || p.GUID != bp.GUID || (p.Name != BootPartition && hashRange(t, base, bp.Offset, bp.Size) != hashRange(t, disk, p.Offset, p.Size)) {
			t.Errorf("partition %s changed", p.Name)
		}
	}
	if l.Size != alignUp(l.Partitions[len(l.Partitions)-1].Offset+l.Partitions[len(l.Partitions)-1].Size+5*4096, MiB) {
		t.Errorf("disk size %d not fit", l.Size)
	}
	if got, err := ReadIgnition(disk); err != nil || !bytes.Equal(got, testIgnition) {
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
	if got, err := Inspect(dev); err != nil || got.SectorSize != 4096 || len(got.Partitions) != len(l.Partitions) {
		t.Errorf("Inspect(%s): %+v, %v", dev, got, err)
	}
	img, _ := l.Find(contract.PartitionName)
	compareTrees(t, tree, loopMount(t, disk, *img))
}
