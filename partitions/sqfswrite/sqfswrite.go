// Package sqfswrite writes an uncompressed squashfs 4.0 of a tree that holds
// only directories and regular files — what a kiln bundle is — with each
// file's contents copied into place by the kernel (copy_file_range), where
// mksquashfs reads and writes every byte in user space.
//
// Layout (the kernel's fs/squashfs/squashfs_fs.h): the 96-byte superblock,
// then the file contents one after the other, each starting on a 4 KiB
// boundary of the filesystem (so a filesystem with reflinks can share the
// blocks) and stored as uncompressed 1 MiB blocks with no fragments and no
// sparse blocks, so every file is one byte range whose offset is known
// before a byte is written; then the inode table, the directory table and
// the id table (one id: root), all in uncompressed metadata blocks. No
// export table, no xattrs. Entries are sorted by name, every inode has the
// same mtime and is owned by root, modes are the tree's: the same tree
// gives the same bytes.
package sqfswrite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
	mtime int64
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
	inodes   []byte // inode table, as written
	dirs     []byte // directory table, as written
	count    uint32 // inodes
	rootRef  uint64
	bytesUse int64
}

// Scan reads the tree and lays the filesystem out. It refuses anything
// squashfs-by-kiln does not store (symlinks, devices, sockets, FIFOs, names
// longer than 256 bytes) with the path that is wrong. Hard links are stored
// as separate files.
func Scan(tree string, opts ...Option) (*Plan, error) {
	p := &Plan{}
	for _, o := range opts {
		o(&p.cfg)
	}
	if p.cfg.mtime < 0 || p.cfg.mtime > math.MaxUint32 {
		return nil, fmt.Errorf("modification time %d: squashfs stores seconds from 1970 to 2106", p.cfg.mtime)
	}
	root, err := scan(tree)
	if err != nil {
		return nil, err
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
	for _, f := range p.files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := copyFile(ctx, out, offset+f.offset, f.path, f.size, progress); err != nil {
			return err
		}
	}
	tables := make([]byte, 0, int(p.bytesUse-p.dataEnd))
	tables = append(tables, p.inodes...)
	tables = append(tables, p.dirs...)
	idBlock := p.dataEnd + int64(len(tables))
	tables = binary.LittleEndian.AppendUint16(tables, metaUncompressed|4)
	tables = binary.LittleEndian.AppendUint32(tables, 0) // the one id: root
	tables = binary.LittleEndian.AppendUint64(tables, uint64(idBlock))
	if _, err := out.WriteAt(tables, offset+p.dataEnd); err != nil {
		return fmt.Errorf("write squashfs tables: %w", err)
	}
	if err := out.Truncate(offset + p.Size()); err != nil { // the 4 KiB padding
		return fmt.Errorf("pad squashfs: %w", err)
	}
	if _, err := out.WriteAt(p.superblock(idBlock), offset); err != nil {
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

func (p *Plan) superblock(idBlock int64) []byte {
	le := binary.LittleEndian
	b := make([]byte, 0, superblockSize)
	b = append(b, "hsqs"...)
	b = le.AppendUint32(b, p.count)
	b = le.AppendUint32(b, uint32(p.cfg.mtime))
	b = le.AppendUint32(b, blockSize)
	b = le.AppendUint32(b, 0) // fragments
	b = le.AppendUint16(b, zlib)
	b = le.AppendUint16(b, blockLog)
	b = le.AppendUint16(b, flagNoI|flagNoD|flagNoF|flagNoFrag|flagNoX|flagNoXattr)
	b = le.AppendUint16(b, 1) // ids
	b = le.AppendUint16(b, 4) // version 4.0
	b = le.AppendUint16(b, 0)
	b = le.AppendUint64(b, p.rootRef)
	b = le.AppendUint64(b, uint64(p.bytesUse))
	b = le.AppendUint64(b, uint64(idBlock+6)) // id table: the index after its one block
	b = le.AppendUint64(b, invalidBlk)        // xattr id table
	b = le.AppendUint64(b, uint64(p.dataEnd)) // inode table
	b = le.AppendUint64(b, uint64(p.dataEnd+int64(len(p.inodes))))
	b = le.AppendUint64(b, uint64(idBlock)) // fragment table: empty, where it would start (as mksquashfs)
	b = le.AppendUint64(b, invalidBlk)      // lookup (export) table
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
			if c.dir {
				walk(c)
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
