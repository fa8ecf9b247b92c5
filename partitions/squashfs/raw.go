package squashfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// Raw reads the regular files of an uncompressed squashfs (kiln's
// default: -noI -noD -noF -no-fragments) as the byte ranges they are in the
// image, with plain ReadAt calls: the read-back check of a build hashes a
// whole partition this way at the speed of sha256, where go-diskfs's reader
// copies and allocates every block. Only what that needs is here: walking
// directories by name and reading regular files (sparse blocks included).
// Format: the squashfs 4.0 on-disk layout as the kernel's fs/squashfs reads it.
type Raw struct {
	r         io.ReaderAt // the filesystem, from its byte 0
	blockSize int64
	inodes    int64 // inode table start
	dirs      int64 // directory table start
	root      uint64
	used      int64 // bytes_used: no size or offset read may exceed it
}

const (
	sqFlagUncompressedInodes = 0x0001
	sqFlagUncompressedData   = 0x0002
	sqFlagNoFragments        = 0x0010

	sqBasicDir  = 1
	sqBasicFile = 2
	sqExtDir    = 8
	sqExtFile   = 9

	sqMetaUncompressed = 0x8000
	sqDataUncompressed = 1 << 24
	sqNoFragment       = 0xffffffff
)

// ErrNotRaw says a filesystem (or a file of it) is not one Raw reads.
var ErrNotRaw = errors.New("squashfs is compressed or has fragments")

// OpenRaw reads the superblock; ErrNotRaw if the filesystem needs a
// decompressor.
func OpenRaw(r io.ReaderAt) (*Raw, error) {
	sb := make([]byte, 96)
	if _, err := r.ReadAt(sb, 0); err != nil {
		return nil, fmt.Errorf("read squashfs superblock: %w", err)
	}
	le := binary.LittleEndian
	if string(sb[:4]) != "hsqs" || le.Uint16(sb[28:]) != 4 {
		return nil, errors.New("not a squashfs 4.0 filesystem")
	}
	flags := le.Uint16(sb[24:])
	need := uint16(sqFlagUncompressedInodes | sqFlagUncompressedData | sqFlagNoFragments)
	if flags&need != need {
		return nil, ErrNotRaw
	}
	return &Raw{
		r:         r,
		blockSize: int64(le.Uint32(sb[12:])),
		root:      le.Uint64(sb[32:]),
		inodes:    int64(le.Uint64(sb[64:])),
		dirs:      int64(le.Uint64(sb[72:])),
		used:      int64(le.Uint64(sb[40:])),
	}, nil
}

// meta reads n bytes of a metadata table from block (relative to table)
// and offset within its uncompressed data, following on into next blocks.
func (s *Raw) meta(table, block int64, offset int, n int) ([]byte, error) {
	if n < 0 || int64(n) > s.used || block < 0 || table+block > s.used {
		return nil, fmt.Errorf("squashfs metadata: %d bytes at %d+%d lie outside the filesystem: it is damaged", n, table, block)
	}
	out := make([]byte, 0, n)
	pos := table + block
	for len(out) < n {
		var hdr [2]byte
		if _, err := s.r.ReadAt(hdr[:], pos); err != nil {
			return nil, fmt.Errorf("squashfs metadata at %d: %w", pos, err)
		}
		h := binary.LittleEndian.Uint16(hdr[:])
		size := int(h &^ sqMetaUncompressed)
		if h&sqMetaUncompressed == 0 || size == 0 || size > 8192 || offset > size {
			return nil, fmt.Errorf("squashfs metadata block at %d: compressed or damaged (header %#x)", pos, h)
		}
		buf := make([]byte, size)
		if _, err := s.r.ReadAt(buf, pos+2); err != nil {
			return nil, fmt.Errorf("squashfs metadata at %d: %w", pos, err)
		}
		out = append(out, buf[offset:min(size, offset+n-len(out))]...)
		offset = 0
		pos += 2 + int64(size)
	}
	return out, nil
}

// rawInode is what is read of an inode: a directory's listing or a file's
// data blocks.
type rawInode struct {
	typ        uint16
	mode       fs.FileMode
	dirBlock   int64 // directory: listing in the directory table
	dirOffset  int
	dirSize    int
	blocks     int64 // file: data start, relative to the filesystem
	size       int64
	blockSizes []uint32
}

func (s *Raw) inode(ref uint64) (*rawInode, error) {
	block, offset := int64(ref>>16), int(ref&0xffff)
	le := binary.LittleEndian
	hdr, err := s.meta(s.inodes, block, offset, 16)
	if err != nil {
		return nil, err
	}
	in := &rawInode{typ: le.Uint16(hdr), mode: fs.FileMode(le.Uint16(hdr[2:]) & 0o777)}
	fixed := map[uint16]int{sqBasicDir: 16, sqExtDir: 24, sqBasicFile: 16, sqExtFile: 40}[in.typ]
	if fixed == 0 {
		return in, nil // neither a directory nor a regular file
	}
	all, err := s.meta(s.inodes, block, offset, 16+fixed)
	if err != nil {
		return nil, err
	}
	b := all[16:]
	switch in.typ {
	case sqBasicDir:
		in.dirBlock, in.dirSize, in.dirOffset = int64(le.Uint32(b)), int(le.Uint16(b[8:])), int(le.Uint16(b[10:]))
		in.mode |= fs.ModeDir
		return in, nil
	case sqExtDir:
		in.dirSize, in.dirBlock, in.dirOffset = int(le.Uint32(b[4:])), int64(le.Uint32(b[8:])), int(le.Uint16(b[18:]))
		in.mode |= fs.ModeDir
		return in, nil
	case sqBasicFile:
		if le.Uint32(b[4:]) != sqNoFragment {
			return nil, ErrNotRaw
		}
		in.blocks, in.size = int64(le.Uint32(b)), int64(le.Uint32(b[12:]))
	case sqExtFile:
		if le.Uint32(b[28:]) != sqNoFragment {
			return nil, ErrNotRaw
		}
		in.blocks, in.size = int64(le.Uint64(b)), int64(le.Uint64(b[8:]))
	}
	if in.size < 0 || in.size > s.used || in.blocks < 0 || in.blocks > s.used || s.blockSize <= 0 {
		return nil, fmt.Errorf("squashfs inode: file of %d bytes at %d does not fit the filesystem: it is damaged", in.size, in.blocks)
	}
	// The block list follows the fixed part (and may go on into the next
	// metadata block).
	nblocks := int((in.size + s.blockSize - 1) / s.blockSize)
	all, err = s.meta(s.inodes, block, offset, 16+fixed+4*nblocks)
	if err != nil {
		return nil, err
	}
	list := all[16+fixed:]
	for i := 0; i < nblocks; i++ {
		in.blockSizes = append(in.blockSizes, le.Uint32(list[i*4:]))
	}
	return in, nil
}

// lookup finds name (slash-separated, no leading slash) from the root.
func (s *Raw) lookup(name string) (*rawInode, error) {
	in, err := s.inode(s.root)
	if err != nil {
		return nil, err
	}
	if name == "." {
		return in, nil
	}
	for _, part := range strings.Split(name, "/") {
		if in.mode&fs.ModeDir == 0 {
			return nil, fs.ErrNotExist
		}
		ref, ok, err := s.find(in, part)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fs.ErrNotExist
		}
		if in, err = s.inode(ref); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// find looks part up in directory dir and returns its inode reference.
func (s *Raw) find(dir *rawInode, part string) (uint64, bool, error) {
	if dir.dirSize <= 3 { // empty: the size counts 3 bytes more than the listing
		return 0, false, nil
	}
	data, err := s.meta(s.dirs, dir.dirBlock, dir.dirOffset, dir.dirSize-3)
	if err != nil {
		return 0, false, err
	}
	le := binary.LittleEndian
	for len(data) >= 12 {
		count, start := int(le.Uint32(data))+1, uint64(le.Uint32(data[4:]))
		data = data[12:]
		for i := 0; i < count; i++ {
			if len(data) < 8 {
				return 0, false, errors.New("squashfs directory listing is damaged")
			}
			offset, nameLen := uint64(le.Uint16(data)), int(le.Uint16(data[6:]))+1
			if len(data) < 8+nameLen {
				return 0, false, errors.New("squashfs directory listing is damaged")
			}
			if string(data[8:8+nameLen]) == part {
				return start<<16 | offset, true, nil
			}
			data = data[8+nameLen:]
		}
	}
	return 0, false, nil
}

// Open opens a regular file for reading (fs.FS).
func (s *Raw) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	in, err := s.lookup(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	if in.typ != sqBasicFile && in.typ != sqExtFile {
		return nil, &fs.PathError{Op: "open", Path: name, Err: errors.New("not a regular file")}
	}
	return &rawFile{s: s, in: in, name: path.Base(name), pos: in.blocks}, nil
}

// rawFile reads a file's blocks in order: stored ones from the image,
// sparse ones (size 0) as zeros.
type rawFile struct {
	s    *Raw
	in   *rawInode
	name string
	i    int   // current block
	off  int64 // bytes read of it
	pos  int64 // its position in the image
}

var zeros = make([]byte, 64<<10)

func (f *rawFile) Read(p []byte) (int, error) {
	for f.i < len(f.in.blockSizes) {
		want := min(f.s.blockSize, f.in.size-int64(f.i)*f.s.blockSize) // this block's length
		bs := f.in.blockSizes[f.i]
		stored := int64(bs &^ sqDataUncompressed)
		if stored != 0 && bs&sqDataUncompressed == 0 {
			return 0, fmt.Errorf("%s: block %d is compressed", f.name, f.i)
		}
		if stored != 0 && stored != want {
			return 0, fmt.Errorf("%s: block %d holds %d bytes, want %d: the filesystem is damaged", f.name, f.i, stored, want)
		}
		if f.off == want {
			f.i, f.off, f.pos = f.i+1, 0, f.pos+stored
			continue
		}
		n := int(min(int64(len(p)), want-f.off))
		if stored == 0 { // sparse: zeros, nothing stored
			n = copy(p[:n], zeros)
			f.off += int64(n)
			return n, nil
		}
		m, err := f.s.r.ReadAt(p[:n], f.pos+f.off)
		f.off += int64(m)
		if m < n { // the image ends inside the file
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return m, fmt.Errorf("%s: %w", f.name, err)
		}
		return m, nil
	}
	return 0, io.EOF
}

func (f *rawFile) Stat() (fs.FileInfo, error) { return rawInfo{f.name, f.in}, nil }
func (f *rawFile) Close() error               { return nil }

type rawInfo struct {
	name string
	in   *rawInode
}

func (i rawInfo) Name() string       { return i.name }
func (i rawInfo) Size() int64        { return i.in.size }
func (i rawInfo) Mode() fs.FileMode  { return i.in.mode }
func (i rawInfo) ModTime() time.Time { return time.Time{} }
func (i rawInfo) IsDir() bool        { return i.in.mode.IsDir() }
func (i rawInfo) Sys() any           { return nil }

// Extent is a run of a regular file's bytes: N bytes stored at Off of the
// filesystem, or, Sparse, N zero bytes stored nowhere (Off is then where
// the file's next stored block begins).
type Extent struct {
	Off, N int64
	Sparse bool
}

// File is a regular file of the filesystem as the byte ranges it is
// stored in, in the file's order (contiguous stored blocks are one extent).
type File struct {
	Path    string
	Size    int64
	Start   int64 // where its first extent lies
	Extents []Extent
}

// Files finds where each of paths (slash-separated, from the root) is
// stored, sorted by where it starts; ErrNotRaw if one is compressed.
func (s *Raw) Files(paths []string) ([]File, error) {
	var files []File
	for _, p := range paths {
		in, err := s.lookup(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if in.typ != sqBasicFile && in.typ != sqExtFile {
			return nil, fmt.Errorf("%s: not a regular file", p)
		}
		f := File{Path: p, Size: in.size, Start: in.blocks}
		pos := in.blocks
		for i, bs := range in.blockSizes {
			want := min(s.blockSize, in.size-int64(i)*s.blockSize)
			stored := int64(bs &^ sqDataUncompressed)
			switch {
			case stored == 0:
				f.Extents = append(f.Extents, Extent{Off: pos, N: want, Sparse: true})
				continue
			case bs&sqDataUncompressed == 0:
				return nil, ErrNotRaw
			case stored != want:
				return nil, fmt.Errorf("%s: block %d holds %d bytes, want %d: the filesystem is damaged", p, i, stored, want)
			case pos+stored > s.used:
				return nil, fmt.Errorf("%s: block %d lies past the end of the filesystem: it is damaged", p, i)
			}
			if k := len(f.Extents) - 1; k >= 0 && !f.Extents[k].Sparse && f.Extents[k].Off+f.Extents[k].N == pos {
				f.Extents[k].N += stored // contiguous: one extent
			} else {
				f.Extents = append(f.Extents, Extent{Off: pos, N: stored})
			}
			pos += stored
		}
		files = append(files, f)
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].Start < files[j].Start })
	return files, nil
}
