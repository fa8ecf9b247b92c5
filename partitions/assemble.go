// Package partitions assembles kiln's output disk: the base image's
// partitions copied byte for byte, the image partition (squashfs, its
// dm-verity tree, kiln's seal) added after them, a new GPT, and the
// Ignition config in the boot partition. Each of those is a package of its
// own below this one (base, squashfs, verity, seal, gpt, bootconfig);
// this one plans where everything goes (geometry) and runs the steps in
// order, the long ones side by side.
package partitions

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Disk says what goes on the disk; each part is one step's.
type Disk struct {
	Base     Base     // the base image, whose partitions are copied
	Geometry Geometry // where the image partition goes, and the sizes
	Image    Image    // the image partition's content
	// SourceDateEpoch is every timestamp written (squashfs, ext4 inodes).
	SourceDateEpoch int64
	// GUIDSeed derives the disk GUID, the image partition's GUID and its
	// verity salt and UUID, so the same inputs give the same disk. Required.
	GUIDSeed []byte
}

// Base is the base disk image (raw, gzip, xz or zstd); Digest, if not "",
// is the expected "sha256:…" of the file's bytes.
type Base struct{ Path, Digest string }

// Geometry is where the image partition goes and how large things are.
type Geometry struct {
	// DiskSize is the output size in bytes; 0 means fit: just large enough.
	DiskSize int64
	// PartitionSize is the image partition size in bytes; 0 means auto: the
	// filesystem plus Headroom percent, rounded up to 1 MiB.
	PartitionSize int64
	// Headroom in percent for an auto-sized partition (the recipe default
	// of 10 is applied by the caller).
	Headroom int
	// Placement of the image partition: PlaceBeforeRoot moves the root
	// partition (GPT name "root", physically the last of the base) after
	// the image partition, so CoreOS's growpart can grow root (and /var,
	// where containers live) into the rest of whatever disk the image lands
	// on; root keeps its number, GUIDs and bytes, only its offset changes.
	// PlaceEnd puts the image partition after the base's last partition.
	// PlaceAuto (or "") is PlaceBeforeRoot when root is last, else PlaceEnd.
	Placement string
}

// Image is the image partition's content and filesystem.
type Image struct {
	Tree string // the staged tree
	// Compression of the filesystem: "" or "none", "zstd", "gzip", "xz",
	// "lz4".
	Compression string
	// NoVerity leaves out the dm-verity hash tree (for kernels without
	// dm-verity); the seal then covers the image partition by its sha256.
	NoVerity bool
	// Attrs sets the mode and owner of some of the tree's files in the
	// filesystem, whatever the staged files have.
	Attrs []squashfs.FileAttrs
}

// Placements of the image partition (Geometry.Placement), as the recipe
// spells them.
const (
	PlaceAuto       = contract.PlaceAuto
	PlaceBeforeRoot = contract.PlaceBeforeRoot
	PlaceEnd        = contract.PlaceEnd
)

// ImageIdentity is how the node finds and checks the image partition.
type ImageIdentity struct {
	PartitionGUID string         // lower case, as /dev/disk/by-partuuid names it
	Verity        *verity.Verity // nil with NoVerity
}

// Option adds to what Assemble does.
type Option func(*options)

type options struct {
	ignition           func(ImageIdentity) ([]byte, error)
	partName, partType string
	hashFiles          []string
	hashStep           string
	filesHashed        func(map[string]squashfs.FileDigest) error
	kept               *verity.KeptTrees
	known              map[string]squashfs.FileDigest
	tempDir            string
	progress           progress.Reporter
	esp                func(ctx context.Context, disk string, l *gpt.Layout, id ImageIdentity) error
}

// WithIgnition renders the config written to ignition/config.ign in the
// boot partition, once the image partition's identity is known (the node's
// units name its GUID and verity root hash). Without it nothing is written
// (and what the base has stays).
func WithIgnition(render func(ImageIdentity) ([]byte, error)) Option {
	return func(o *options) { o.ignition = render }
}

// WithESP runs write once the image partition's identity is known and the
// new partition table and the Ignition config are written, before the seal
// records every byte: write changes the disk's EFI system partition in
// place (disk is the output file, l its layout), e.g. the signed unified
// kernel images that carry the image partition's root hash.
func WithESP(write func(ctx context.Context, disk string, l *gpt.Layout, id ImageIdentity) error) Option {
	return func(o *options) { o.esp = write }
}

// WithPartition names the added partition in the GPT (default
// contract.PartitionName and contract.PartitionType; a reflash stick's
// payload partition has its own).
func WithPartition(name, typ string) Option {
	return func(o *options) { o.partName, o.partType = name, typ }
}

// WithFileHashes hands hashed the size and sha256, as written, of the files
// of the image filesystem named by paths (slash-separated): the builder
// checks there the blobs the squashfs writer read straight from their
// source. With an uncompressed filesystem and verity on, the files are
// hashed in the same read of the partition as the verity tree's data
// level; otherwise in a read of their own alongside the rest of the
// assembly. step names that read in the progress. An error from hashed
// fails the assembly.
func WithFileHashes(paths []string, step string, hashed func(map[string]squashfs.FileDigest) error) Option {
	return func(o *options) { o.hashFiles, o.hashStep, o.filesHashed = paths, step, hashed }
}

// WithKeptTrees keeps this filesystem's verity tree in kept for a later
// build of the same filesystem, and copies a kept one instead of hashing
// the partition when this is that build (the caller commits or discards
// what Assemble staged). known names files of the image filesystem by the
// size and sha256 the caller vouches for (blobs, by their locked digest):
// in the tree's key they stand for their bytes, which are not read. A file
// hashed by WithFileHashes is hashed in this build whatever the kept tree,
// and then kept.
func WithKeptTrees(kept *verity.KeptTrees, known map[string]squashfs.FileDigest) Option {
	return func(o *options) { o.kept, o.known = kept, known }
}

// WithTempDir is where Assemble writes its temporary files (the Ignition
// config for debugfs, mksquashfs's pseudo file); default $TMPDIR. A build
// gives its work directory, which the next build removes if this one is
// killed before it could.
func WithTempDir(dir string) Option { return func(o *options) { o.tempDir = dir } }

// WithProgress reports the long steps to p.
func WithProgress(p progress.Reporter) Option { return func(o *options) { o.progress = p } }

// Assemble writes the whole disk into out and returns its layout. out is
// the disk file, created empty by the caller (a temp file it renames on
// success and removes on failure); Assemble writes it through its path too
// (the squashfs writers), so it must be a named file. On error out holds
// garbage. If ctx is cancelled, the running tool is killed and ctx.Err()
// returned.
func Assemble(ctx context.Context, out *os.File, d Disk, opts ...Option) (*gpt.Layout, error) {
	a, err := newAssembly(out, d, opts)
	if err != nil {
		return nil, err
	}
	defer a.cleanup()
	for _, step := range []func(context.Context) error{
		a.placeImagePartition,
		a.writeFilesystem, // first: mksquashfs truncates its output file, and sqfswrite writes only past its end
		a.startChecks,
		a.sizeDisk,
		a.hashAndCopy,
		a.writeTable,
		a.writeIgnition,
		a.writeESP,
		a.seal,
		a.waitChecks,
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return gpt.Inspect(out.Name())
}

// assembly is one run of Assemble: each step reads what the steps before
// it left here.
type assembly struct {
	out      *os.File
	d        Disk
	o        options
	progress progress.Reporter

	base     *gpt.Layout // the base's partition table
	labels   bool        // base's filesystems were detected (a raw base)
	place    placement
	fsSize   int64         // bytes of the image filesystem
	files    *verity.Files // the files to hash, fed by the verity pass; nil: read through the filesystem
	checked  chan error    // the files' hashing's result, when it reads through the filesystem
	stop     func()        // stops it on an early return
	geo      geometry
	id       ImageIdentity
	image    seal.Image  // the seal's record of the image partition
	table    *gpt.Layout // the new partition table
	written  *gpt.Layout // the disk as written, before the seal
	writeEnd func()      // waits for the filesystem's writeback
}

func newAssembly(out *os.File, d Disk, opts []Option) (*assembly, error) {
	o := options{partName: contract.PartitionName, partType: contract.PartitionType, hashStep: "check files read back"}
	for _, opt := range opts {
		opt(&o)
	}
	if o.progress == nil {
		o.progress = progress.Discard()
	}
	switch {
	case len(o.hashFiles) > 0 && o.filesHashed == nil:
		return nil, errors.New("assemble: files to hash but nothing to hand their digests to")
	case o.partType == "":
		return nil, fmt.Errorf("assemble: partition %s has no type GUID", o.partName)
	case out == nil:
		return nil, errors.New("assemble: no output file")
	case d.Base.Path == "":
		return nil, errors.New("assemble: no base image")
	case d.Image.Tree == "":
		return nil, errors.New("assemble: no image partition tree")
	case len(d.GUIDSeed) == 0:
		return nil, errors.New("assemble: empty GUID seed (needed for reproducible disk GUIDs)")
	case d.Geometry.Headroom < 0:
		return nil, fmt.Errorf("image partition headroom %d%% is negative", d.Geometry.Headroom)
	case d.Geometry.DiskSize < 0 || d.Geometry.PartitionSize < 0:
		return nil, errors.New("assemble: negative size")
	}
	return &assembly{out: out, d: d, o: o, progress: o.progress, stop: func() {}, writeEnd: func() {}}, nil
}

// cleanup stops the files' hashing through the filesystem on an early
// return (it never goes on reading) and waits for the writeback.
func (a *assembly) cleanup() {
	a.stop()
	a.writeEnd()
}

// placeImagePartition reads the base's table and decides where the image
// partition goes: after the base's last partition (or after the last one
// but root, which moves).
func (a *assembly) placeImagePartition(context.Context) error {
	path := a.d.Base.Path
	var err error
	if a.base, a.labels, err = base.ReadLayout(path); err != nil {
		return err
	}
	for _, name := range []string{contract.PartitionName, a.o.partName} {
		if p, ok := a.base.Find(name); ok {
			return fmt.Errorf("base image %s already has a %s partition (number %d): it is a kiln disk, not a base; build from the vendor's base image", path, name, p.Number)
		}
	}
	if a.place, err = placeImagePartition(a.base, path, a.d.Geometry); err != nil {
		return err
	}
	// Fail before the long steps where we can.
	if _, err := bootconfig.Find(a.base); err != nil && a.labels {
		return fmt.Errorf("base image %s: %w", path, err)
	}
	return nil
}

// writeFilesystem writes the image filesystem at the partition's start.
func (a *assembly) writeFilesystem(ctx context.Context) error {
	var err error
	a.fsSize, err = squashfs.Write(ctx, squashfs.Options{
		Tree: a.d.Image.Tree, Disk: a.out.Name(), Offset: a.place.start,
		Compression: a.d.Image.Compression, SourceDateEpoch: a.d.SourceDateEpoch, Attrs: a.d.Image.Attrs,
		TempDir: a.o.tempDir, Progress: a.progress,
		// When the verity tree will likely be copied, nothing but the disk
		// is left after the write: let it write alongside.
		WritebackEarly: !a.d.Image.NoVerity && len(a.o.hashFiles) == 0 && a.o.kept.Any(),
	})
	if err != nil {
		return err
	}
	a.writeEnd = startWriteback(a.out, a.place.start, a.fsSize)
	return nil
}

// startChecks starts the files' hashing through the filesystem, when the
// verity pass cannot feed them, alongside the rest.
func (a *assembly) startChecks(ctx context.Context) error {
	var err error
	if a.files, err = a.planHashFiles(); err != nil {
		return err
	}
	if len(a.o.hashFiles) == 0 || a.files != nil {
		return nil
	}
	checkCtx, cancel := context.WithCancel(ctx)
	a.checked = make(chan error, 1)
	go func() { a.checked <- a.hashThroughFilesystem(checkCtx) }()
	a.stop = func() {
		cancel()
		if a.checked != nil {
			<-a.checked
		}
	}
	return nil
}

// sizeDisk completes the plan, checked before the long base copy (the
// partition holds the filesystem, its verity tree, headroom, and the seal
// at its end), and grows the disk to its size: the seal's digest of the
// image partition reads to the partition's end.
func (a *assembly) sizeDisk(context.Context) error {
	var treeSize int64
	if !a.d.Image.NoVerity {
		treeSize = verity.TreeSize(a.fsSize / verity.Block)
	}
	var err error
	if a.geo, err = a.place.size(a.fsSize, treeSize+seal.Size, a.d.Geometry); err != nil {
		return err
	}
	if err := a.out.Truncate(a.geo.diskSize); err != nil {
		return fmt.Errorf("grow disk to %s: %w", human(a.geo.diskSize), err)
	}
	return nil
}

// hashAndCopy writes the verity tree (and hashes the files) and copies the
// base partitions byte for byte, at once: disjoint ranges of the disk
// file, one mostly CPU, the other mostly I/O. Then it hashes what verity
// does not cover, for the seal: without verity that is the whole
// filesystem, hashed while the disk writes it back (later, Ignition's
// fsync waits for that).
func (a *assembly) hashAndCopy(ctx context.Context) error {
	a.id.PartitionGUID = gpt.DeriveGUID(a.d.GUIDSeed, a.o.partName)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.copyBase(gctx) })
	g.Go(func() (err error) {
		var from int64
		if !a.d.Image.NoVerity {
			if a.id.Verity, err = a.writeVerity(gctx); err != nil {
				return err
			}
			from = a.id.Verity.HashOffset + a.id.Verity.HashSize
		}
		a.image.DigestFrom = from
		a.image.Digest, err = seal.Digest(gctx, a.out, a.geo.start+from, a.geo.partSize-seal.Size-from)
		return err
	})
	if err := g.Wait(); err != nil {
		return err
	}
	if a.id.Verity != nil {
		guid, err := a.id.Verity.PartitionGUID()
		if err != nil {
			return err
		}
		a.id.PartitionGUID = strings.ToLower(guid)
	}
	return nil
}

// writeVerity writes the hash tree right after the filesystem, with a salt
// and superblock UUID derived from the build's inputs (reproducible), and
// hands the files (if any) to the caller, hashed in the same read; or
// copies the tree kept from an earlier build of the same filesystem.
func (a *assembly) writeVerity(ctx context.Context) (*verity.Verity, error) {
	part := &offsetFile{a.out, a.geo.start}
	salt := sha256.Sum256(append([]byte("kiln verity salt\x00"), a.d.GUIDSeed...))
	t := verity.Tree{
		Data: part, Out: part, DataBlocks: a.fsSize / verity.Block, HashOffset: a.fsSize,
		Salt: salt[:], UUID: uuid.MustParse(gpt.DeriveGUID(a.d.GUIDSeed, "verity")), Files: a.files,
	}
	key := ""
	if a.o.kept != nil {
		key, _ = verity.TreeKey(t, a.o.known) // "": hashed, not kept
		if key != "" && a.files == nil {
			if v, ok := a.o.kept.Copy(key, t); ok {
				a.progress.Task(verity.KeptTreeStep, 0).Done(nil)
				return v, nil
			}
		}
	}
	var task progress.Task = progress.Discard().Task("", 0)
	if a.files != nil { // the step that reads the partition is the files' check
		task = a.progress.Task(a.o.hashStep, a.fsSize)
		t.Progress = task
	}
	v, err := t.Write(ctx)
	if err == nil && key != "" {
		// Staged now, kept by the caller's Commit once the files' digests
		// are checked; a tree that cannot be staged is hashed next time.
		a.o.kept.Stage(key, t)
	}
	if err == nil && a.files != nil {
		var sums map[string]squashfs.FileDigest
		if sums, err = a.files.Finish(); err == nil {
			err = a.o.filesHashed(sums)
		} else {
			err = fmt.Errorf("read back the image filesystem: %w", err)
		}
	}
	task.Done(err)
	if err != nil {
		return nil, fmt.Errorf("image partition verity tree: %w", err)
	}
	return v, nil
}

// writeTable writes the new partition table: the base's partitions (root
// moved when it moves) and the image partition, under a disk GUID derived
// from the seed (the seal's replaces it at the end).
func (a *assembly) writeTable(context.Context) error {
	g, sector := a.geo, int64(a.base.SectorSize)
	t := &gpt.Layout{SectorSize: a.base.SectorSize, GUID: gpt.DeriveGUID(a.d.GUIDSeed, "disk")}
	t.Partitions = append([]gpt.Partition(nil), a.base.Partitions...)
	last := 0
	for i := range t.Partitions {
		p := &t.Partitions[i]
		if g.root != nil && p.Number == g.root.Number {
			p.FirstLBA = uint64(g.rootDst / sector)
			p.LastLBA = p.FirstLBA + uint64(g.root.Size/sector) - 1
		}
		last = max(last, p.Number)
	}
	t.Partitions = append(t.Partitions, gpt.Partition{
		Number:   last + 1,
		FirstLBA: uint64(g.start / sector),
		LastLBA:  uint64((g.start+g.partSize)/sector - 1),
		Type:     a.o.partType,
		Name:     a.o.partName,
		GUID:     a.id.PartitionGUID,
	})
	a.table = t
	return gpt.Write(a.out, t, g.diskSize)
}

// writeIgnition renders the config for the image partition's identity and
// writes it into the boot partition (found by name or label).
func (a *assembly) writeIgnition(context.Context) error {
	var err error
	if a.written, err = gpt.Inspect(a.out.Name()); err != nil {
		return fmt.Errorf("check the new disk: %w", err)
	}
	boot, err := bootconfig.Find(a.written)
	if err != nil {
		return fmt.Errorf("base image %s: %w", a.d.Base.Path, err)
	}
	if a.o.ignition == nil {
		return nil
	}
	config, err := a.o.ignition(a.id)
	if err != nil {
		return err
	}
	return bootconfig.Write(a.out.Name(), boot.Offset, config, a.d.SourceDateEpoch, a.o.tempDir)
}

// writeESP runs the caller's WithESP, if any.
func (a *assembly) writeESP(ctx context.Context) error {
	if a.o.esp == nil {
		return nil
	}
	return a.o.esp(ctx, a.out.Name(), a.written, a.id)
}

// seal writes the seal, last: it records every byte written so far, and
// its digest becomes the disk GUID (only the GPT headers change).
func (a *assembly) seal(ctx context.Context) error {
	img, _ := a.written.Find(a.o.partName)
	a.image.FSSize, a.image.Verity = a.fsSize, a.id.Verity
	area, err := seal.Write(ctx, a.out, a.written, img, a.image)
	if err != nil {
		return fmt.Errorf("seal the disk: %w", err)
	}
	a.table.GUID = seal.GUID(area)
	if err := gpt.Write(a.out, a.table, a.geo.diskSize); err != nil {
		return err
	}
	if err := a.out.Sync(); err != nil {
		return fmt.Errorf("sync disk: %w", err)
	}
	return nil
}

// waitChecks waits for the files' hashing through the filesystem, if it
// runs.
func (a *assembly) waitChecks(context.Context) error {
	if a.checked == nil {
		return nil
	}
	err := <-a.checked
	a.checked = nil
	return err
}

// offsetFile reads and writes a file from an offset: a partition inside
// the disk file.
type offsetFile struct {
	f   *os.File
	off int64
}

func (o *offsetFile) ReadAt(p []byte, off int64) (int, error)  { return o.f.ReadAt(p, o.off+off) }
func (o *offsetFile) WriteAt(p []byte, off int64) (int, error) { return o.f.WriteAt(p, o.off+off) }
