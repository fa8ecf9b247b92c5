// Package partitions assembles kiln's output disk: the base image's
// partitions copied byte for byte, the image partition (squashfs) added after
// them, a new GPT, and the Ignition config in the boot partition. It also
// reads such disks back for `kiln inspect` and `kiln verify`.
package partitions

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"strings"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// AssembleOptions says what goes on the disk.
type AssembleOptions struct {
	// Output is the disk file, created empty by the caller (a temp file it
	// renames on success and removes on failure). Assemble writes it through
	// its path too (the squashfs writers), so it must be a named file.
	Output *os.File
	// Base is the base disk image (raw, gzip, xz or zstd); BaseDigest, if
	// not "", is the expected "sha256:…" of the file's bytes.
	Base       string
	BaseDigest string
	// ImageTree is the staged content of the image partition.
	ImageTree string
	// DiskSize is the output size in bytes; 0 means fit: just large enough.
	DiskSize int64
	// PartitionSize is the image partition size in bytes; 0 means auto: the
	// filesystem plus Headroom percent, rounded up to 1 MiB.
	PartitionSize int64
	// Headroom in percent for an auto-sized partition (the recipe default
	// of 10 is applied by the caller).
	Headroom int
	// Compression of the image filesystem: "" or "none", "zstd", "gzip",
	// "xz", "lz4".
	Compression string
	// SourceDateEpoch is every timestamp written (squashfs, ext4 inodes).
	SourceDateEpoch int64
	// GUIDSeed derives the disk GUID and the image partition's GUID, so the
	// same inputs give the same disk. Required.
	GUIDSeed []byte
	// Ignition renders the config written to ignition/config.ign in the
	// boot partition, once the image partition's identity is known (the
	// node's units name its GUID and verity root hash); nil writes nothing
	// (and leaves what the base has).
	Ignition func(ImageIdentity) ([]byte, error)
	// NoVerity leaves out the dm-verity hash tree (for kernels without
	// dm-verity); the seal then covers the image partition by its sha256.
	NoVerity bool
	// Placement of the image partition: PlaceBeforeRoot moves the root
	// partition (GPT name "root", physically the last of the base) after
	// the image partition, so CoreOS's growpart can grow root (and /var,
	// where containers live) into the rest of whatever disk the image lands
	// on; root keeps its number, GUIDs and bytes, only its offset changes.
	// PlaceEnd puts the image partition after the base's last partition.
	// PlaceAuto (or "") is PlaceBeforeRoot when root is last, else PlaceEnd.
	Placement string
	// Attrs sets the mode and owner of some of the tree's files in the
	// filesystem, whatever the staged files have.
	Attrs []FileAttrs
	// CheckFilesystem, if set, is called as soon as the image filesystem is
	// written, with that filesystem open read-only: the builder checks there
	// the blobs the squashfs writer read straight from their source (the bytes
	// written, not the source's, which could change in between). It runs
	// alongside the rest of the assembly (CPU while the disk is busy) and
	// Assemble returns only after it; an error fails the assembly.
	// open may be called several times (once per goroutine: each reader
	// is for one goroutine at a time).
	CheckFilesystem func(ctx context.Context, open func() (fs.FS, error)) error
	// HashFiles names files of the image filesystem (slash-separated
	// paths) whose size and sha256 as written FilesHashed receives: the
	// builder checks there the blobs the squashfs writer read straight from their
	// source (the bytes written, not the source's, which could change in
	// between). With an uncompressed filesystem and verity on, the files
	// are hashed in the same read of the partition as the verity tree's
	// data level (hashLevel0); otherwise in a read of their own alongside
	// the rest of the assembly. An error from FilesHashed fails the
	// assembly.
	// HashFilesStep names that step in Progress (default "check files
	// read back").
	HashFiles     []string
	FilesHashed   func(map[string]FileDigest) error
	HashFilesStep string
	// VerityTrees, if set, keeps this filesystem's verity tree for a later
	// build of the same filesystem, and copies a kept one instead of
	// hashing the partition when this is that build (see VerityTrees; the
	// caller commits or discards what Assemble staged). KnownFiles names
	// files of the image filesystem by the size and sha256 the caller
	// vouches for (blobs, by their locked digest): in the tree's key they
	// stand for their bytes, which are not read. A file listed in HashFiles
	// is hashed in this build whatever the kept tree, and then kept.
	VerityTrees *VerityTrees
	KnownFiles  map[string]FileDigest
	// PartitionName and PartitionType name the added partition in the GPT
	// (default contract.PartitionName and contract.PartitionType; a reflash
	// stick's payload partition has its own).
	PartitionName, PartitionType string
	// TempDir is where Assemble writes its temporary files (the Ignition
	// config for debugfs, mksquashfs's pseudo file); default $TMPDIR. A
	// build gives its work directory, which the next build removes if this
	// one is killed before it could.
	TempDir string
	// Progress may be nil.
	Progress Reporter
	// sealVersion, when set, seals as that version instead of SealVersion:
	// tests build the disks an older kiln wrote.
	sealVersion int
}

// ImageIdentity is how the node finds and checks the image partition.
type ImageIdentity struct {
	PartitionGUID string  // lower case, as /dev/disk/by-partuuid names it
	Verity        *Verity // nil with NoVerity
}

// StaticIgnition renders the same config whatever the identity.
func StaticIgnition(config []byte) func(ImageIdentity) ([]byte, error) {
	return func(ImageIdentity) ([]byte, error) { return config, nil }
}

// Placements of the image partition (AssembleOptions.Placement), as the
// recipe spells them.
const (
	PlaceAuto       = contract.PlaceAuto
	PlaceBeforeRoot = contract.PlaceBeforeRoot
	PlaceEnd        = contract.PlaceEnd
)

// kilnNamespace is the name-based UUID namespace of GUIDs kiln derives.
var kilnNamespace = uuid.MustParse("6f0e5a0c-3b7e-4d49-9a8e-1c2b7d4e9f30")

// DeriveGUID returns the GUID for purpose ("disk", a partition name) from
// seed: a name-based (SHA-1, version 5) UUID, in lower case as
// /dev/disk/by-partuuid names it (Layout shows GUIDs in upper case).
func DeriveGUID(seed []byte, purpose string) string {
	data := append([]byte(purpose+"\x00"), seed...)
	return uuid.NewSHA1(kilnNamespace, data).String()
}

// Assemble writes the whole disk into opts.Output and returns its layout.
// On error the Output file holds garbage; the caller removes it. If ctx is
// cancelled, the running tool is killed and ctx.Err() returned.
func Assemble(ctx context.Context, opts AssembleOptions) (*Layout, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	disk := opts.Output.Name()

	// 1. Where the image partition goes: after the base's last partition
	// (with RootLast: after the last one but root, which moves).
	base, err := readBaseLayout(opts.Base)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{contract.PartitionName, opts.PartitionName} {
		if p, ok := base.Find(name); ok {
			return nil, fmt.Errorf("base image %s already has a %s partition (number %d): it is a kiln disk, not a base; build from the vendor's base image", opts.Base, name, p.Number)
		}
	}
	place, err := placeImagePartition(base, opts.Base, opts.Placement, opts.DiskSize)
	if err != nil {
		return nil, err
	}
	// Fail before the long steps where we can.
	if _, err := bootPartition(base); err != nil && base.labelsRead {
		return nil, fmt.Errorf("base image %s: %w", opts.Base, err)
	}

	// 2. The filesystem first: mksquashfs truncates its output file, and
	// sqfswrite writes only past its end.
	fsSize, err := writeSquashfs(ctx, squashfsOptions{
		Tree: opts.ImageTree, Disk: disk, Offset: place.start,
		Compression: opts.Compression, SourceDateEpoch: opts.SourceDateEpoch, Attrs: opts.Attrs, TempDir: opts.TempDir, Progress: opts.Progress,
		// When the verity tree will likely be copied, nothing but the disk
		// is left after the write: let it write alongside.
		WritebackEarly: !opts.NoVerity && len(opts.HashFiles) == 0 && opts.VerityTrees.any(),
	})
	if err != nil {
		return nil, err
	}
	defer startWriteback(opts.Output, place.start, fsSize)()
	var checked chan error
	// The files to hash are fed by the verity pass when it can read them
	// raw; else they are read through the filesystem alongside the rest.
	files, err := planHashFiles(opts, place.start, fsSize)
	if err != nil {
		return nil, err
	}
	if opts.CheckFilesystem != nil || (len(opts.HashFiles) > 0 && files == nil) {
		checkCtx, cancel := context.WithCancel(ctx)
		checked = make(chan error, 1)
		go func() { checked <- checkFilesystem(checkCtx, opts, place.start, fsSize, files == nil) }()
		defer func() { // on an early return: stop it, and never leave it reading
			cancel()
			if checked != nil {
				<-checked
			}
		}()
	}

	// 3. Sizes, checked before the long base copy. The partition holds the
	// filesystem, its verity tree, headroom, and the seal at its end.
	var treeSize int64
	if !opts.NoVerity {
		treeSize = verityTreeSize(fsSize / VerityBlock)
	}
	g, err := place.size(fsSize, treeSize+SealSize, opts.Headroom, opts.PartitionSize, opts.DiskSize)
	if err != nil {
		return nil, err
	}
	start, partSize, size, root, rootDst := g.start, g.partSize, g.diskSize, g.root, g.rootDst
	sector := int64(base.SectorSize)
	id := ImageIdentity{PartitionGUID: DeriveGUID(opts.GUIDSeed, opts.PartitionName)}
	// 4. The verity tree (and the files' check) and the base partitions,
	// byte for byte, at once: disjoint ranges of the disk file, one mostly
	// CPU, the other mostly I/O.
	// The disk at its full size first: the seal's digest of the image
	// partition reads to the partition's end.
	if err := opts.Output.Truncate(size); err != nil {
		return nil, fmt.Errorf("grow disk to %s: %w", human(size), err)
	}
	version := cmp.Or(opts.sealVersion, SealVersion)
	// The seal's digest of the image partition: what verity does not cover,
	// to the seal. Without verity that is the whole filesystem, hashed now,
	// while the disk writes it back (later, Ignition's fsync waits for that).
	var image SealImage
	imageDigest := func(from int64) (err error) {
		image.DigestFrom = from
		image.Digest, err = digestRange(ctx, version, opts.Output, start+from, partSize-SealSize-from)
		return err
	}
	steps, stepsCtx := errgroup.WithContext(ctx)
	steps.Go(func() error { return copyBase(stepsCtx, opts, g.segments()) })
	if !opts.NoVerity {
		steps.Go(func() (err error) {
			if id.Verity, err = writeImageVerity(stepsCtx, opts, start, fsSize, files); err != nil {
				return err
			}
			return imageDigest(id.Verity.HashOffset + id.Verity.HashSize)
		})
	} else {
		steps.Go(func() error { return imageDigest(0) })
	}
	if err := steps.Wait(); err != nil {
		return nil, err
	}
	if id.Verity != nil {
		g, err := RootHashGUID(id.Verity.RootHash)
		if err != nil {
			return nil, err
		}
		id.PartitionGUID = strings.ToLower(g)
	}

	// 5. The new partition table.
	if root != nil {
		moved := *base
		moved.Partitions = append([]Partition(nil), base.Partitions...)
		for i := range moved.Partitions {
			if p := &moved.Partitions[i]; p.Number == root.Number {
				p.FirstLBA = uint64(rootDst / sector)
				p.LastLBA = p.FirstLBA + uint64(root.Size/sector) - 1
			}
		}
		base = &moved
	}
	if err := writeTable(opts.Output, base, size, start, partSize, DeriveGUID(opts.GUIDSeed, "disk"), opts.added(id.PartitionGUID)); err != nil {
		return nil, err
	}

	// 6. Ignition into the boot partition (found by name or label).
	l, err := Inspect(disk)
	if err != nil {
		return nil, fmt.Errorf("check the new disk: %w", err)
	}
	boot, err := bootPartition(l)
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", opts.Base, err)
	}
	if opts.Ignition != nil {
		config, err := opts.Ignition(id)
		if err != nil {
			return nil, err
		}
		if err := writeIgnition(disk, boot.Offset, config, opts.SourceDateEpoch, opts.TempDir); err != nil {
			return nil, err
		}
	}

	// 7. The seal, last: it records every byte written so far, and its
	// digest becomes the disk GUID (only the GPT headers change).
	img, _ := l.Find(opts.PartitionName)
	image.FSSize, image.Verity = fsSize, id.Verity
	seal, err := sealDisk(ctx, version, opts.Output, l, img, image)
	if err != nil {
		return nil, fmt.Errorf("seal the disk: %w", err)
	}
	if err := writeTable(opts.Output, base, size, start, partSize, SealGUID(seal), opts.added(id.PartitionGUID)); err != nil {
		return nil, err
	}
	if err := opts.Output.Sync(); err != nil {
		return nil, fmt.Errorf("sync disk: %w", err)
	}
	if checked != nil {
		err := <-checked
		checked = nil
		if err != nil {
			return nil, err
		}
	}
	return Inspect(disk)
}

// checkFilesystem hands opts.CheckFilesystem a way to open the image
// filesystem just written and, with hashFiles, hashes opts.HashFiles through
// it for opts.FilesHashed.
func checkFilesystem(ctx context.Context, opts AssembleOptions, start, fsSize int64, hashFilesToo bool) error {
	open := func() (fs.FS, error) {
		raw, err := openRawSquashfs(&offsetFile{opts.Output, start})
		if err == nil {
			return raw, nil
		}
		if !errors.Is(err, errNotRaw) {
			return nil, fmt.Errorf("read back the image filesystem: %w", err)
		}
		fsys, err := openSquashfs(opts.Output, start, fsSize) // compressed: go-diskfs decompresses
		if err != nil {
			return nil, fmt.Errorf("read back the image filesystem: %w", err)
		}
		return fsys, nil
	}
	var g errgroup.Group
	if opts.CheckFilesystem != nil {
		g.Go(func() error { return opts.CheckFilesystem(ctx, open) })
	}
	if hashFilesToo && len(opts.HashFiles) > 0 {
		g.Go(func() (err error) {
			task := progressOf(opts.Progress).Task(opts.HashFilesStep, 0)
			defer func() { task.Done(err) }()
			sums, err := hashFiles(ctx, open, opts.HashFiles, task)
			if err != nil {
				return fmt.Errorf("read back the image filesystem: %w", err)
			}
			return opts.FilesHashed(sums)
		})
	}
	return g.Wait()
}

// planHashFiles finds opts.HashFiles in the written filesystem for the
// verity pass to hash; nil when that pass cannot (no verity, a compressed
// filesystem) or there is nothing to hash.
func planHashFiles(opts AssembleOptions, start, fsSize int64) (*fileFeeder, error) {
	if len(opts.HashFiles) == 0 || opts.NoVerity {
		return nil, nil
	}
	raw, err := openRawSquashfs(io.NewSectionReader(opts.Output, start, fsSize))
	if errors.Is(err, errNotRaw) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read back the image filesystem: %w", err)
	}
	files, err := planFileHashes(raw, opts.HashFiles)
	if errors.Is(err, errNotRaw) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read back the image filesystem: %w", err)
	}
	return &fileFeeder{files: files}, nil
}

// writeImageVerity writes the hash tree right after the filesystem, with a
// salt and superblock UUID derived from the build's inputs (reproducible),
// and hands files (if not nil) to opts.FilesHashed, hashed in the same read.
func writeImageVerity(ctx context.Context, opts AssembleOptions, start, fsSize int64, files *fileFeeder) (*Verity, error) {
	part := &offsetFile{opts.Output, start}
	salt := sha256.Sum256(append([]byte("kiln verity salt\x00"), opts.GUIDSeed...))
	id := uuid.MustParse(DeriveGUID(opts.GUIDSeed, "verity"))
	key := ""
	if opts.VerityTrees != nil {
		key, _ = treeKey(part, fsSize, salt[:], opts.KnownFiles) // "": hashed, not kept
		if key != "" && files == nil {
			if v, ok := keptVerity(opts, part, fsSize, salt[:], id, key); ok {
				return v, nil
			}
		}
	}
	var task Task = discardTask{}
	if files != nil { // the step that reads the partition is the files' check
		task = progressOf(opts.Progress).Task(opts.HashFilesStep, fsSize)
	}
	v, err := writeVerity(ctx, part, part, fsSize/VerityBlock, fsSize, salt[:], id, files, task)
	if err == nil && key != "" {
		// Staged now, kept by the caller's Commit once the files' digests
		// are checked; a tree that cannot be staged is hashed next time.
		opts.VerityTrees.stage(key, part, fsSize+VerityBlock, v.HashSize-VerityBlock)
	}
	if err == nil && files != nil {
		var sums map[string]FileDigest
		if sums, err = files.finish(); err == nil {
			err = opts.FilesHashed(sums)
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

// sealDisk writes the seal at the end of the image partition and returns
// its area.
func sealDisk(ctx context.Context, version int, f *os.File, l *Layout, img *Partition, image SealImage) ([]byte, error) {
	sector := int64(l.SectorSize)
	s := &Seal{SchemaVersion: version, DiskSize: l.Size, SectorSize: l.SectorSize}
	var err error
	if s.GPTHeaders, err = headerDigest(version, f, sector); err != nil {
		return nil, err
	}
	_, backup, err := gptHeaderSectors(f, sector)
	if err != nil {
		return nil, err
	}
	// The digests are independent: hash them on every CPU (mostly holes,
	// hashed from memory: hashSpan).
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	g.Go(func() (err error) {
		s.Outside, err = outsideDigest(ctx, version, f, l.Size, sector, l.Partitions, 1, backup)
		return err
	})
	s.Partitions = make([]SealPartition, len(l.Partitions))
	for i, p := range l.Partitions {
		sp := &s.Partitions[i]
		*sp = SealPartition{Number: p.Number, Name: p.Name, Type: p.Type, GUID: p.GUID, FirstLBA: p.FirstLBA, LastLBA: p.LastLBA, Attributes: p.Attributes}
		if p.Number != img.Number {
			g.Go(func() (err error) {
				sp.Digest, err = digestRange(ctx, version, f, p.Offset, p.Size)
				return err
			})
		}
	}
	s.Image = image
	if err := g.Wait(); err != nil {
		return nil, err
	}
	area, err := encodeSeal(s)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteAt(area, img.Offset+img.Size-SealSize); err != nil {
		return nil, fmt.Errorf("write seal: %w", err)
	}
	return area, nil
}

// offsetFile reads and writes a file from an offset: a partition inside
// the disk file.
type offsetFile struct {
	f   *os.File
	off int64
}

func (o *offsetFile) ReadAt(p []byte, off int64) (int, error)  { return o.f.ReadAt(p, o.off+off) }
func (o *offsetFile) WriteAt(p []byte, off int64) (int, error) { return o.f.WriteAt(p, o.off+off) }

func (o *AssembleOptions) check() error {
	if o.PartitionName == "" {
		o.PartitionName, o.PartitionType = contract.PartitionName, contract.PartitionType
	}
	if o.HashFilesStep == "" {
		o.HashFilesStep = "check files read back"
	}
	if len(o.HashFiles) > 0 && o.FilesHashed == nil {
		return errors.New("assemble: files to hash but no FilesHashed to hand their digests to")
	}
	switch {
	case o.PartitionType == "":
		return fmt.Errorf("assemble: partition %s has no type GUID", o.PartitionName)
	case o.Output == nil:
		return errors.New("assemble: no output file")
	case o.Base == "":
		return errors.New("assemble: no base image")
	case o.ImageTree == "":
		return errors.New("assemble: no image partition tree")
	case len(o.GUIDSeed) == 0:
		return errors.New("assemble: empty GUID seed (needed for reproducible disk GUIDs)")
	case o.Headroom < 0:
		return fmt.Errorf("image partition headroom %d%% is negative", o.Headroom)
	case o.DiskSize < 0 || o.PartitionSize < 0:
		return errors.New("assemble: negative size")
	}
	return nil
}

// readBaseLayout reads the base's partition table from its first MiB; for a
// raw base, also the filesystem labels.
func readBaseLayout(path string) (*Layout, error) {
	b, err := OpenBase(path, "")
	if err != nil {
		return nil, err
	}
	defer b.Close()
	var r io.ReaderAt = b.file
	if b.Format != BaseRaw {
		head := make([]byte, MiB)
		n, err := io.ReadFull(b, head)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, err
		}
		r = bytes.NewReader(head[:n])
	}
	l, _, err := readLayout(r, "base image "+path)
	if err != nil {
		return nil, err
	}
	l.labelsRead = b.Format == BaseRaw
	if len(l.Partitions) == 0 {
		return nil, fmt.Errorf("base image %s has an empty partition table", path)
	}
	return l, nil
}

// segment is a byte range of the base and where it goes on the disk.
type segment struct{ src, size, dst int64 }

// lastRoot finds the partition named root and checks it is physically last.
func lastRoot(l *Layout) (*Partition, error) {
	var root *Partition
	for i := range l.Partitions {
		if l.Partitions[i].Name == "root" {
			root = &l.Partitions[i]
		}
	}
	if root == nil {
		return nil, fmt.Errorf("no partition named \"root\" to move after the image partition (partitions: %s)", l.names())
	}
	for _, p := range l.Partitions {
		if p.Offset > root.Offset {
			return nil, fmt.Errorf("partition %d %q lies after root; kiln moves root only when it is the last partition", p.Number, p.Name)
		}
	}
	return root, nil
}

// copyBase streams the base and writes the bytes of each segment to its
// place, leaving holes where the base is zero; the base is read to its end
// so its digest is checked.
func copyBase(ctx context.Context, opts AssembleOptions, segs []segment) (err error) {
	var n int64 // bytes of the base needed
	for _, s := range segs {
		n = max(n, s.src+s.size)
	}
	b, err := OpenBase(opts.Base, opts.BaseDigest)
	if err != nil {
		return err
	}
	defer b.Close()
	task := progressOf(opts.Progress).Task("copy base partitions", n)
	defer func() { task.Done(err) }()

	buf := make([]byte, MiB)
	var off int64
	for off < n {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := io.ReadFull(b, buf[:min(int64(len(buf)), n-off)])
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF { // a short raw file, not a decoder error
				return fmt.Errorf("base image %s ends at %s, before the end of its last partition at %s: it is truncated", opts.Base, human(off+int64(m)), human(n))
			}
			return err
		}
		for _, s := range segs {
			lo, hi := max(off, s.src), min(off+int64(m), s.src+s.size)
			if lo < hi {
				if err := writeSparse(opts.Output, buf[lo-off:hi-off], s.dst+lo-s.src); err != nil {
					return err
				}
			}
		}
		off += int64(m)
		task.Write(buf[:m])
	}
	if _, err := io.Copy(io.Discard, b); err != nil {
		return err
	}
	return nil
}

// writeSparse writes p at off, skipping all-zero 64 KiB runs (the output
// starts as a hole, so they read back as zeros anyway).
func writeSparse(f *os.File, p []byte, off int64) error {
	const chunk = 64 << 10
	var zero [chunk]byte
	for i := 0; i < len(p); i += chunk {
		c := p[i:min(i+chunk, len(p))]
		if bytes.Equal(c, zero[:len(c)]) {
			continue
		}
		if _, err := f.WriteAt(c, off+int64(i)); err != nil {
			return fmt.Errorf("write disk: %w", err)
		}
	}
	return nil
}

// writeTable writes protective MBR, primary and backup GPT: the base's
// partitions unchanged plus the image partition.
// added is the GPT entry's identity of the partition kiln adds.
type added struct{ name, typ, guid string }

func (o *AssembleOptions) added(guid string) added {
	return added{o.PartitionName, o.PartitionType, guid}
}

func writeTable(f *os.File, base *Layout, size, start, partSize int64, diskGUID string, img added) error {
	sector := int64(base.SectorSize)
	t := &gpt.Table{
		LogicalSectorSize:  base.SectorSize,
		PhysicalSectorSize: base.SectorSize,
		ProtectiveMBR:      true,
		GUID:               diskGUID,
	}
	last := 0
	for _, p := range base.Partitions {
		t.Partitions = append(t.Partitions, &gpt.Partition{
			Index: p.Number, Start: p.FirstLBA, End: p.LastLBA,
			Type: gpt.Type(p.Type), Name: p.Name, GUID: p.GUID, Attributes: p.Attributes,
		})
		last = max(last, p.Number)
	}
	t.Partitions = append(t.Partitions, &gpt.Partition{
		Index: last + 1,
		Start: uint64(start / sector),
		End:   uint64((start+partSize)/sector - 1),
		Type:  gpt.Type(img.typ),
		Name:  img.name,
		GUID:  img.guid,
	})
	if err := t.Write(f, size); err != nil {
		return fmt.Errorf("write partition table: %w", err)
	}
	return nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// human prints a byte count the way sizes are written in recipes.
func human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= MiB && n%MiB == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= MiB:
		return fmt.Sprintf("%.2f MiB", float64(n)/MiB)
	}
	return fmt.Sprintf("%d bytes", n)
}

// startWriteback starts writing n bytes of f at off to the device in the
// background and returns a function that waits until the kernel has queued
// them. The filesystem just written is only dirty page cache; without this
// the disk sees none of it until the final fsync, after the hashing that
// reads it back, so the two would run one after the other instead of side by
// side. A failure is not an error: the final fsync writes and reports.
func startWriteback(f *os.File, off, n int64) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
	}()
	return func() { <-done }
}
