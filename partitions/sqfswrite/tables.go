package sqfswrite

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
)

// Inode types (squashfs_fs.h).
const (
	typeDir     = 1
	typeReg     = 2
	typeSymlink = 3
	typeBlk     = 4
	typeChr     = 5
	typeFifo    = 6
	typeSocket  = 7
	typeLong    = 7 // extended type = basic + 7
	typeLongDir = typeDir + typeLong
	typeLongReg = typeReg + typeLong
)

// metaTable builds a metadata table: its bytes cut into 8 KiB blocks, each
// stored uncompressed behind a 2-byte header. As every block but the last
// is full, a position in the uncompressed bytes maps to its block by
// arithmetic.
type metaTable struct{ data []byte }

func (t *metaTable) pos() int64 { return int64(len(t.data)) }

// block is the on-disk start (relative to the table) of the block holding
// uncompressed position pos.
func block(pos int64) uint32 { return uint32(pos / metaSize * (metaSize + 2)) }

// ref is the squashfs reference (block << 16 | offset) of position pos.
func ref(pos int64) uint64 { return uint64(block(pos))<<16 | uint64(pos%metaSize) }

// bytes is the table as stored.
func (t *metaTable) bytes() []byte {
	out := make([]byte, 0, len(t.data)+2*(len(t.data)/metaSize+1))
	for at := 0; at < len(t.data); at += metaSize {
		chunk := t.data[at:min(at+metaSize, len(t.data))]
		out = binary.LittleEndian.AppendUint16(out, uint16(metaUncompressed|len(chunk)))
		out = append(out, chunk...)
	}
	return out
}

// buildTables numbers the inodes and writes the inode and directory
// tables as mksquashfs orders them: depth first, a directory's children
// before it (its listing names their inodes), the root last; a hard-linked
// inode where its first name is. Then the id table and the xattr tables.
func (p *Plan) buildTables() error {
	var number func(d *node) error
	number = func(d *node) error {
		for _, c := range d.children {
			if c.typ == typeDir {
				if err := number(c); err != nil {
					return err
				}
				continue
			}
			if c.link != nil {
				continue
			}
			if p.count == math.MaxUint32-1 {
				return errTooMany
			}
			p.count++
			c.ino = p.count
		}
		if p.count == math.MaxUint32-1 {
			return errTooMany
		}
		p.count++
		d.ino = p.count
		return nil
	}
	if err := number(p.root); err != nil {
		return err
	}
	ids, err := p.idTable()
	if err != nil {
		return err
	}
	var inodes, dirs metaTable
	var visit func(d *node, parent uint32) error
	visit = func(d *node, parent uint32) error {
		for _, c := range d.children {
			if c.typ == typeDir {
				if err := visit(c, d.ino); err != nil {
					return err
				}
				continue
			}
			if c.link != nil {
				continue
			}
			c.ref = ref(inodes.pos())
			inodes.data = p.inode(inodes.data, c, ids)
		}
		l := listed{start: dirs.pos()}
		listing, index := dirListing(d)
		if len(listing)+3 > math.MaxUint32 || len(index) > math.MaxUint16 {
			return fmt.Errorf("squashfs tree: directory %q has too many entries (%d) for one squashfs directory", d.rel, len(d.children))
		}
		l.size, l.index = len(listing), index
		dirs.data = append(dirs.data, listing...)
		d.ref = ref(inodes.pos())
		inodes.data = p.dirInode(inodes.data, d, parent, l, ids)
		return nil
	}
	if err := visit(p.root, p.count+1); err != nil { // the root's parent: one past the last inode, as mksquashfs writes
		return err
	}
	p.rootRef = p.root.ref

	le := binary.LittleEndian
	t := append(inodes.bytes(), dirs.bytes()...)
	p.dirStart = p.dataEnd + int64(len(t)-len(dirs.bytes()))
	var idt metaTable
	for _, id := range ids.list {
		idt.data = le.AppendUint32(idt.data, id)
	}
	p.idStart = p.dataEnd + int64(len(t))
	t = append(t, idt.bytes()...)
	p.idIndex = p.dataEnd + int64(len(t))
	for b := int64(0); b < int64(len(idt.data)); b += metaSize {
		t = le.AppendUint64(t, uint64(p.idStart+int64(block(b))))
	}
	p.ids = len(ids.list)
	p.xattrIDs = -1
	if len(p.xattrs.sets) > 0 {
		table, xids, header := p.xattrs.tables(p.dataEnd + int64(len(t)))
		t = append(append(t, table...), xids...)
		p.xattrIDs = header
	}
	p.tables = t
	p.bytesUse = p.dataEnd + int64(len(t))
	return nil
}

// ids maps every uid and gid to its index in the id table.
type ids struct {
	index map[uint32]uint16
	list  []uint32 // ascending
}

func (p *Plan) idTable() (*ids, error) {
	set := map[uint32]bool{}
	var walk func(n *node)
	walk = func(n *node) {
		set[n.uid], set[n.gid] = true, true
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(p.root)
	if len(set) > math.MaxUint16 {
		return nil, fmt.Errorf("squashfs tree: %d distinct uids and gids; squashfs holds at most %d", len(set), math.MaxUint16)
	}
	t := &ids{index: map[uint32]uint16{}}
	for id := range set {
		t.list = append(t.list, id)
	}
	sort.Slice(t.list, func(i, j int) bool { return t.list[i] < t.list[j] })
	for i, id := range t.list {
		t.index[id] = uint16(i)
	}
	return t, nil
}

func (p *Plan) inodeHeader(b []byte, typ uint16, n *node, ids *ids) []byte {
	le := binary.LittleEndian
	b = le.AppendUint16(b, typ)
	b = le.AppendUint16(b, n.mode)
	b = le.AppendUint16(b, ids.index[n.uid])
	b = le.AppendUint16(b, ids.index[n.gid])
	b = le.AppendUint32(b, uint32(p.cfg.mtime))
	return le.AppendUint32(b, n.ino)
}

// inode appends the inode of anything but a directory: basic, or extended
// where it has xattrs (or, a file, more than one name or 32-bit limits).
func (p *Plan) inode(b []byte, n *node, ids *ids) []byte {
	le := binary.LittleEndian
	nlink := max(n.nlink, 1)
	long := n.xattr != noXattr
	typ := n.typ
	if long {
		typ += typeLong
	}
	switch n.typ {
	case typeReg:
		return p.fileInode(b, n, ids)
	case typeSymlink:
		b = p.inodeHeader(b, typ, n, ids)
		b = le.AppendUint32(b, nlink)
		b = le.AppendUint32(b, uint32(len(n.target)))
		b = append(b, n.target...)
	case typeBlk, typeChr:
		b = p.inodeHeader(b, typ, n, ids)
		b = le.AppendUint32(b, nlink)
		b = le.AppendUint32(b, n.rdev)
	default: // FIFO, socket
		b = p.inodeHeader(b, typ, n, ids)
		b = le.AppendUint32(b, nlink)
	}
	if long {
		b = le.AppendUint32(b, n.xattr)
	}
	return b
}

// fileInode appends a regular file's inode: basic while start and size fit
// 32 bits and it has one name and no xattrs, else extended; then one
// uncompressed block size per 1 MiB.
func (p *Plan) fileInode(b []byte, f *node, ids *ids) []byte {
	le := binary.LittleEndian
	if f.offset <= math.MaxUint32 && f.size <= math.MaxUint32 && f.nlink <= 1 && f.xattr == noXattr {
		b = p.inodeHeader(b, typeReg, f, ids)
		b = le.AppendUint32(b, uint32(f.offset))
		b = le.AppendUint32(b, math.MaxUint32) // no fragment
		b = le.AppendUint32(b, 0)
		b = le.AppendUint32(b, uint32(f.size))
	} else {
		b = p.inodeHeader(b, typeLongReg, f, ids)
		b = le.AppendUint64(b, uint64(f.offset))
		b = le.AppendUint64(b, uint64(f.size))
		b = le.AppendUint64(b, 0) // sparse bytes
		b = le.AppendUint32(b, max(f.nlink, 1))
		b = le.AppendUint32(b, math.MaxUint32) // no fragment
		b = le.AppendUint32(b, 0)
		b = le.AppendUint32(b, f.xattr)
	}
	for left := f.size; left > 0; left -= blockSize {
		b = le.AppendUint32(b, uint32(min(left, blockSize))|dataUncompressed)
	}
	return b
}

// dirIndex marks a directory header the kernel's lookup may start at, so
// it need not read a large listing from its beginning.
type dirIndex struct {
	at   int // the header's position in the listing
	name string
}

// listed is where a directory's listing went in the directory table: from
// start, size bytes, and its index (see dirListing).
type listed struct {
	start int64
	size  int
	index []dirIndex
}

// dirInode appends a directory's inode: basic, or extended when the listing
// is too long for one or carries an index.
func (p *Plan) dirInode(b []byte, d *node, parent uint32, l listed, ids *ids) []byte {
	le := binary.LittleEndian
	start, index := l.start, l.index
	size := l.size + 3 // squashfs counts "." and ".." as 3 bytes
	if len(index) == 0 && size <= math.MaxUint16 && d.xattr == noXattr {
		b = p.inodeHeader(b, typeDir, d, ids)
		b = le.AppendUint32(b, block(start))
		b = le.AppendUint32(b, 2+d.subdirs)
		b = le.AppendUint16(b, uint16(size))
		b = le.AppendUint16(b, uint16(start%metaSize))
		return le.AppendUint32(b, parent)
	}
	b = p.inodeHeader(b, typeLongDir, d, ids)
	b = le.AppendUint32(b, 2+d.subdirs)
	b = le.AppendUint32(b, uint32(size))
	b = le.AppendUint32(b, block(start))
	b = le.AppendUint32(b, parent)
	b = le.AppendUint16(b, uint16(len(index)))
	b = le.AppendUint16(b, uint16(start%metaSize))
	b = le.AppendUint32(b, d.xattr)
	for _, ix := range index {
		b = le.AppendUint32(b, uint32(ix.at))
		b = le.AppendUint32(b, block(start+int64(ix.at)))
		b = le.AppendUint32(b, uint32(len(ix.name)-1))
		b = append(b, ix.name...)
	}
	return b
}

// maxHeaderEntries is the most entries one directory header holds.
const maxHeaderEntries = 256

// dirListing encodes a directory's entries: runs of up to 256 entries
// behind a header naming the inode metadata block they share and a base
// inode number they differ from by a 16-bit amount. A new run starts, and
// is indexed, when the listing since the last index would pass a metadata
// block's size (as mksquashfs does). As inodes are numbered in the order
// they are written and none is under 32 bytes, a block holds at most 256 of
// them and numbers within one block differ by less than 256: the count and
// difference limits are checked all the same, as the format's rules.
func dirListing(d *node) ([]byte, []dirIndex) {
	le := binary.LittleEndian
	var b []byte
	var index []dirIndex
	hdr, count, lastIndex := -1, 0, 0
	var hdrBlock, hdrIno uint32
	for _, c := range d.children {
		in := c.inode()
		blk, off := uint32(in.ref>>16), uint16(in.ref&0xffff)
		entry := 8 + len(c.name)
		diff := int64(in.ino) - int64(hdrIno)
		if hdr < 0 || count == maxHeaderEntries || blk != hdrBlock || diff < math.MinInt16 || diff > math.MaxInt16 ||
			len(b)+entry-lastIndex > metaSize {
			if hdr >= 0 {
				le.PutUint32(b[hdr:], uint32(count-1))
				if len(b)+12+entry-lastIndex > metaSize {
					index = append(index, dirIndex{at: len(b), name: c.name})
					lastIndex = len(b)
				}
			}
			hdr, count, hdrBlock, hdrIno, diff = len(b), 0, blk, in.ino, 0
			b = le.AppendUint32(b, 0) // count - 1, filled in when the run ends
			b = le.AppendUint32(b, blk)
			b = le.AppendUint32(b, in.ino)
		}
		b = le.AppendUint16(b, off)
		b = le.AppendUint16(b, uint16(int16(diff)))
		b = le.AppendUint16(b, c.typ) // entries name the basic type, whatever the inode is
		b = le.AppendUint16(b, uint16(len(c.name)-1))
		b = append(b, c.name...)
		count++
	}
	if hdr >= 0 {
		le.PutUint32(b[hdr:], uint32(count-1))
	}
	return b, index
}
