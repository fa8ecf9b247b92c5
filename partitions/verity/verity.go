// Package verity writes and checks the image partition's dm-verity hash
// tree, and keeps trees for rebuilds of the same filesystem (KeptTrees).
//
// The tree is format 1 (what `veritysetup format` writes by default):
// sha256, 4 KiB data and hash blocks, a 512-byte superblock at the start of
// the hash area and the tree one block after it, top level first.
//
// Why kiln computes it itself: veritysetup and containerd/go-dmverity both
// read the data device from byte 0 of a file, but the image partition sits
// inside the disk file, so either would need a loop device (root) or a copy
// of the whole partition. Reading the partition in place costs one pass of
// sha256 over data the squashfs writer has just written (still in the page
// cache), and that pass also hashes the files the build checks (Files).
// The tests check kiln's bytes and root hash against veritysetup's own.
package verity

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"runtime"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-appliance/kiln/partitions/gpt"
)

const (
	Block     = 4096              // data and hash block size
	digest    = sha256.Size       // bytes of one block's digest
	perBlock  = Block / digest    // digests per hash block
	sbSize    = 512               // the superblock
	readChunk = 256 * Block       // 1 MiB: what one read of a level takes
	runBlocks = 64 * perBlock     // a run of a level hashed by one CPU: 32 MiB of data, 64 hash blocks
	hashChunk = readChunk / Block // blocks of one read
)

// Verity is what the node needs to open the image partition through
// dm-verity, and what `kiln verify` checks it against.
type Verity struct {
	RootHash   string `json:"rootHash"`   // hex sha256
	Salt       string `json:"salt"`       // hex, derived from the build's inputs
	DataBlocks int64  `json:"dataBlocks"` // 4 KiB blocks of the filesystem
	HashOffset int64  `json:"hashOffset"` // bytes from the partition start to the superblock
	HashSize   int64  `json:"hashSize"`   // superblock + tree, bytes
	UUID       string `json:"uuid"`       // of the verity superblock
}

// PartitionGUID is the image partition's GUID when verity is on: the first
// 128 bits of the root hash, the Discoverable Partitions Specification's
// convention, so the GUID names the content (upper case, as gpt.Layout
// shows GUIDs).
func (v *Verity) PartitionGUID() (string, error) {
	b, err := hex.DecodeString(v.RootHash)
	if err != nil || len(b) < 16 {
		return "", fmt.Errorf("root hash %q is not hex of at least 16 bytes", v.RootHash)
	}
	return gpt.GUIDOf(b[:16]), nil
}

// levels returns, for each level from the bottom, its size in hash blocks
// and its offset in blocks from the start of the tree.
func levels(dataBlocks int64) (sizes, offsets []int64) {
	n := dataBlocks
	for {
		n = (n + perBlock - 1) / perBlock
		sizes = append(sizes, n)
		if n <= 1 {
			break
		}
	}
	offsets = make([]int64, len(sizes))
	var pos int64
	for i := len(sizes) - 1; i >= 0; i-- { // the top level is stored first
		offsets[i] = pos
		pos += sizes[i]
	}
	return sizes, offsets
}

// TreeSize is the size of superblock and tree for dataBlocks.
func TreeSize(dataBlocks int64) int64 {
	sizes, _ := levels(dataBlocks)
	var n int64
	for _, s := range sizes {
		n += s
	}
	return Block + n*Block
}

// ReadWriterAt is where a tree is written: each upper level is hashed from
// the level below as written, read back.
type ReadWriterAt interface {
	io.ReaderAt
	io.WriterAt
}

// Tree is a hash tree to write: over the first DataBlocks blocks of Data,
// its superblock at HashOffset of Out and the tree one block after it.
type Tree struct {
	Data                   io.ReaderAt
	Out                    ReadWriterAt
	DataBlocks, HashOffset int64
	Salt                   []byte
	UUID                   uuid.UUID
	// Files, if not nil, is fed the data level as it is read (one read
	// of the partition hashes the tree and the files), and Progress (may
	// be nil) counts that read.
	Files    *Files
	Progress io.Writer
}

// Write hashes the data and writes superblock and tree. Level 0 is built
// streaming on every CPU; each upper level is hashed from the level below
// as written (read back from Out), so memory stays at a few blocks whatever
// the partition size.
func (t Tree) Write(ctx context.Context) (*Verity, error) {
	if t.DataBlocks < 2 { // veritysetup has no tree at all for one block
		return nil, errors.New("verity: fewer than 2 data blocks")
	}
	if _, err := t.Out.WriteAt(superblock(t.DataBlocks, t.Salt, t.UUID), t.HashOffset); err != nil {
		return nil, fmt.Errorf("write verity superblock: %w", err)
	}
	tree := t.HashOffset + Block
	sizes, offsets := levels(t.DataBlocks)
	l := level{src: t.Data, n: t.DataBlocks, salt: t.Salt}
	for i := range sizes {
		l.hashes = tree + offsets[i]*Block
		var err error
		if i == 0 {
			err = l.writeData(ctx, t.Out, t.Files, t.Progress)
		} else {
			err = l.write(t.Out)
		}
		if err != nil {
			return nil, err
		}
		l = level{src: t.Out, off: l.hashes, n: sizes[i], salt: t.Salt}
	}
	return t.root(tree)
}

// root reads the tree's top block back and describes the tree.
func (t Tree) root(tree int64) (*Verity, error) {
	top := make([]byte, Block)
	if _, err := t.Out.ReadAt(top, tree); err != nil {
		return nil, fmt.Errorf("read verity tree: %w", err)
	}
	return &Verity{
		RootHash: hex.EncodeToString(saltedHash(t.Salt, top)), Salt: hex.EncodeToString(t.Salt),
		DataBlocks: t.DataBlocks, HashOffset: t.HashOffset, HashSize: TreeSize(t.DataBlocks), UUID: t.UUID.String(),
	}, nil
}

// level is one level of a tree: n blocks of src at off, whose salted
// digests are (or are to be) at hashes, padded with zeros to a whole hash
// block.
type level struct {
	src    io.ReaderAt
	off, n int64
	salt   []byte
	hashes int64
}

// write hashes the level into out on every CPU: the level is cut into runs
// whose digests fill whole hash blocks, so each run writes its own part.
// (sha256 is the build's cost of verity: one pass over the partition.)
func (l level) write(out io.WriterAt) error {
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for from := int64(0); from < l.n; from += runBlocks {
		g.Go(func() error { return l.writeRun(out, from, min(from+runBlocks, l.n)) })
	}
	return g.Wait()
}

// writeRun hashes blocks [from, to) and writes their digests at
// hashes+from*32 (from is a multiple of perBlock: whole hash blocks); the
// run that ends the level pads its last hash block with zeros.
func (l level) writeRun(out io.WriterAt, from, to int64) error {
	in := make([]byte, readChunk)
	hb := make([]byte, 0, readChunk)
	pos := l.hashes + from*digest
	bh := newBlockHasher(l.salt)
	for i := from; i < to; {
		c := min(to-i, hashChunk)
		if _, err := l.src.ReadAt(in[:c*Block], l.off+i*Block); err != nil {
			return fmt.Errorf("read block %d for the verity tree: %w", i, err)
		}
		hb = bh.appendBlocks(hb, in[:c*Block])
		i += c
		if len(hb) == cap(hb) || i == to {
			if i == l.n {
				hb = l.pad(hb)
			}
			if _, err := out.WriteAt(hb, pos); err != nil {
				return fmt.Errorf("write verity tree: %w", err)
			}
			pos += int64(len(hb))
			hb = hb[:0]
		}
	}
	return nil
}

// pad pads the digests that end the level with zeros to a whole hash block.
func (l level) pad(hb []byte) []byte {
	if pad := (l.n * digest) % Block; pad != 0 {
		hb = append(hb, make([]byte, Block-pad)...)
	}
	return hb
}

func saltedHash(salt, block []byte) []byte {
	return newBlockHasher(salt).appendHash(nil, block)
}

// blockHasher hashes verity blocks with a salt, reusing one sha256 state:
// a new state and digest per 4 KiB block were two allocations per block,
// half a million per GiB for the collector to sweep.
type blockHasher struct {
	salt []byte
	h    hash.Hash
}

func newBlockHasher(salt []byte) *blockHasher { return &blockHasher{salt, sha256.New()} }

// appendBlocks appends the salted digest of each whole Block of data to
// dst.
func (b *blockHasher) appendBlocks(dst, data []byte) []byte {
	for j := 0; j+Block <= len(data); j += Block {
		dst = b.appendHash(dst, data[j:j+Block])
	}
	return dst
}

// appendHash appends block's salted digest to dst.
func (b *blockHasher) appendHash(dst, block []byte) []byte {
	b.h.Reset()
	b.h.Write(b.salt)
	b.h.Write(block)
	return b.h.Sum(dst)
}

// superblock is cryptsetup's on-disk verity superblock, version 1.
func superblock(dataBlocks int64, salt []byte, id uuid.UUID) []byte {
	b := make([]byte, sbSize)
	copy(b, "verity\x00\x00")
	binary.LittleEndian.PutUint32(b[8:], 1)  // superblock version
	binary.LittleEndian.PutUint32(b[12:], 1) // hash type: format 1
	copy(b[16:32], id[:])
	copy(b[32:64], "sha256")
	binary.LittleEndian.PutUint32(b[64:], Block)
	binary.LittleEndian.PutUint32(b[68:], Block)
	binary.LittleEndian.PutUint64(b[72:], uint64(dataBlocks))
	binary.LittleEndian.PutUint16(b[80:], uint16(len(salt)))
	copy(b[88:88+256], salt)
	return b
}
