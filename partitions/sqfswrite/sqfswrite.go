// Package sqfswrite writes an uncompressed squashfs 4.0 of a tree with each
// file's contents copied into place by the kernel (copy_file_range), where
// mksquashfs reads and writes every byte in user space. By default it
// stores directories and regular files owned by root, without xattrs, hard
// links as separate files — what a kiln bundle is; with AsIs it stores the
// tree as it is (what the image partition's containers/storage needs):
// symlinks, devices, FIFOs, sockets, hard links, owners and xattrs.
//
// Layout (the kernel's fs/squashfs/squashfs_fs.h): the 96-byte superblock,
// then the file contents one after the other, each starting on a 4 KiB
// boundary of the filesystem (so a filesystem with reflinks can share the
// blocks) and stored as uncompressed 1 MiB blocks with no fragments and no
// sparse blocks, so every file is one byte range whose offset is known
// before a byte is written; then the inode table, the directory table and
// the id table (every uid and gid, ascending) and, if any file has xattrs,
// the xattr table (each distinct set once) and its id table, all in
// uncompressed metadata blocks. No export table. Entries are sorted by
// name, every inode has the same mtime, modes are the tree's: the same
// tree gives the same bytes.
package sqfswrite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
)

// File is one regular file of the filesystem.
type File struct {
	Path   string // slash-separated, relative to the tree
	Offset int64  // where its contents start in the filesystem
	Size   int64
}

// Option configures a Plan.
type Option func(*config)

type config struct {
	mtime     int64
	asIs      bool
	overrides map[string]Attrs
}

// Attrs are the mode and owner a file gets in the filesystem.
type Attrs struct {
	Mode     fs.FileMode
	UID, GID uint32
}

// AsIs stores the tree as it is: every file type, hard links as one inode,
// owners and xattrs (user.*, trusted.*, security.*; any other is refused).
func AsIs() Option { return func(c *config) { c.asIs = true } }

// WithAttrs gives the files named (slash-separated paths relative to the
// tree) their mode and owner in the filesystem, whatever the tree's file
// has. A path that names no file is an error.
func WithAttrs(attrs map[string]Attrs) Option {
	return func(c *config) {
		c.overrides = make(map[string]Attrs, len(attrs))
		for k, v := range attrs {
			c.overrides[k] = v
		}
	}
}

// WithModTime sets every inode's mtime and the filesystem's creation time
// (seconds since 1970; SOURCE_DATE_EPOCH). The default is 0.
func WithModTime(t int64) Option { return func(c *config) { c.mtime = t } }

// Plan is the filesystem of one tree, laid out but not yet written: its
// size and every file's offset are final.
type Plan struct {
	cfg      config
	root     *node
	files    []*node // in the order their contents lie
	dataEnd  int64
	tables   []byte // everything after the data, as written
	count    uint32 // inodes
	rootRef  uint64
	ids      int   // entries of the id table
	idStart  int64 // where the id table's blocks are
	idIndex  int64 // where the id table's index is
	xattrIDs int64 // where the xattr id table's header is, or -1
	dirStart int64 // where the directory table is
	bytesUse int64
	xattrs   xattrSets
}

// Scan reads the tree and lays the filesystem out. It refuses anything it
// does not store (without AsIs: symlinks, devices, sockets, FIFOs; names
// longer than 256 bytes) with the path that is wrong.
func Scan(tree string, opts ...Option) (*Plan, error) {
	p := &Plan{}
	for _, o := range opts {
		o(&p.cfg)
	}
	if p.cfg.mtime < 0 || p.cfg.mtime > math.MaxUint32 {
		return nil, fmt.Errorf("modification time %d: squashfs stores seconds from 1970 to 2106", p.cfg.mtime)
	}
	s := &scanner{cfg: &p.cfg, links: map[[2]uint64]*node{}, xattrs: &p.xattrs}
	root, err := s.scan(tree)
	if err != nil {
		return nil, err
	}
	for rel := range p.cfg.overrides {
		return nil, fmt.Errorf("squashfs tree: attributes given for %s, which is not in the tree", rel)
	}
	p.root = root
	p.layoutData()
	if err := p.buildTables(); err != nil {
		return nil, err
	}
	return p, nil
}

// Size is the filesystem's size in bytes: bytes used, padded to 4 KiB.
func (p *Plan) Size() int64 { return alignUp(p.bytesUse, 4096) }

// DataBytes is the total size of the files' contents.
func (p *Plan) DataBytes() int64 {
	var n int64
	for _, f := range p.files {
		n += f.size
	}
	return n
}

// Files lists the regular files in the order their contents lie.
func (p *Plan) Files() []File {
	out := make([]File, 0, len(p.files))
	for _, f := range p.files {
		out = append(out, File{Path: f.rel, Offset: f.offset, Size: f.size})
	}
	return out
}

// Write writes the filesystem into out at offset, which must be at or past
// out's end (the gaps between files are left as holes, which read as
// zeros). The superblock is written last, so a write cut short leaves no
// filesystem that mounts. A file whose size changed since Scan is an error.
// progress (may be nil) counts the bytes of file contents written; the
// bytes passed are zeros, only their number means anything.
func (p *Plan) Write(ctx context.Context, out *os.File, offset int64, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	st, err := out.Stat()
	if err != nil {
		return err
	}
	if st.Size() > offset {
		return fmt.Errorf("squashfs at byte %d of %s: the file already has %d bytes there; the filesystem is written past its end", offset, out.Name(), st.Size())
	}
	c := &copier{out: out, progress: progress}
	for _, f := range p.files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := c.copyFile(ctx, offset+f.offset, f.path, f.size); err != nil {
			return err
		}
	}
	if _, err := out.WriteAt(p.tables, offset+p.dataEnd); err != nil {
		return fmt.Errorf("write squashfs tables: %w", err)
	}
	if err := out.Truncate(offset + p.Size()); err != nil { // the 4 KiB padding
		return fmt.Errorf("pad squashfs: %w", err)
	}
	if _, err := out.WriteAt(p.superblock(), offset); err != nil {
		return fmt.Errorf("write squashfs superblock: %w", err)
	}
	return nil
}

const (
	blockLog  = 20
	blockSize = 1 << blockLog // the largest squashfs allows: the shortest block lists

	metaSize         = 8192   // uncompressed bytes of a metadata block
	metaUncompressed = 0x8000 // metadata block header: stored uncompressed
	dataUncompressed = 1 << 24

	flagNoI     = 0x0001 // inodes uncompressed
	flagNoD     = 0x0002 // data uncompressed
	flagNoF     = 0x0008 // fragments uncompressed
	flagNoFrag  = 0x0010 // no fragments
	flagNoX     = 0x0100 // xattrs uncompressed
	flagNoXattr = 0x0200 // no xattrs

	zlib       = 1 // the compressor named: nothing is compressed, but the kernel wants a known one
	invalidBlk = math.MaxUint64
)

func (p *Plan) superblock() []byte {
	le := binary.LittleEndian
	flags := uint16(flagNoI | flagNoD | flagNoF | flagNoFrag | flagNoX)
	xattrIDs := uint64(invalidBlk)
	if p.xattrIDs >= 0 {
		xattrIDs = uint64(p.xattrIDs)
	} else {
		flags |= flagNoXattr
	}
	b := make([]byte, 0, superblockSize)
	b = append(b, "hsqs"...)
	b = le.AppendUint32(b, p.count)
	b = le.AppendUint32(b, uint32(p.cfg.mtime))
	b = le.AppendUint32(b, blockSize)
	b = le.AppendUint32(b, 0) // fragments
	b = le.AppendUint16(b, zlib)
	b = le.AppendUint16(b, blockLog)
	b = le.AppendUint16(b, flags)
	b = le.AppendUint16(b, uint16(p.ids))
	b = le.AppendUint16(b, 4) // version 4.0
	b = le.AppendUint16(b, 0)
	b = le.AppendUint64(b, p.rootRef)
	b = le.AppendUint64(b, uint64(p.bytesUse))
	b = le.AppendUint64(b, uint64(p.idIndex))
	b = le.AppendUint64(b, xattrIDs)
	b = le.AppendUint64(b, uint64(p.dataEnd)) // inode table
	b = le.AppendUint64(b, uint64(p.dirStart))
	b = le.AppendUint64(b, uint64(p.idStart)) // fragment table: empty, where it would start (as mksquashfs)
	b = le.AppendUint64(b, invalidBlk)        // lookup (export) table
	return b
}

const superblockSize = 96

// layoutData gives each file its offset: from the end of the superblock,
// file after file in tree order, each non-empty one on a 4 KiB boundary.
func (p *Plan) layoutData() {
	at := int64(superblockSize)
	var walk func(d *node)
	walk = func(d *node) {
		for _, c := range d.children {
			if c.typ == typeDir {
				walk(c)
				continue
			}
			if c.typ != typeReg || c.link != nil {
				continue
			}
			if c.size > 0 {
				at = alignUp(at, 4096)
			}
			c.offset = at
			at += c.size
			p.files = append(p.files, c)
		}
	}
	walk(p.root)
	p.dataEnd = at
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

var errTooMany = errors.New("squashfs tree: more files and directories than squashfs numbers (2^32 - 2)")

// WriteFile writes tree's filesystem into a new file at path (an existing
// one is an error), removed again if the write fails.
func WriteFile(ctx context.Context, tree, path string, opts ...Option) error {
	p, err := Scan(tree, opts...)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("squashfs: %w", err)
	}
	err = p.Write(ctx, f, 0, nil)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
