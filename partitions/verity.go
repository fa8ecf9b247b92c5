package partitions

import (
	"bytes"
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
)

// dm-verity hash tree, format 1 (what `veritysetup format` writes by
// default): sha256, 4 KiB data and hash blocks, a 512-byte superblock at the
// start of the hash area and the tree one block after it, top level first.
//
// Why kiln computes it itself: veritysetup and containerd/go-dmverity both
// read the data device from byte 0 of a file, but the image partition sits
// inside the disk file, so either would need a loop device (root) or a copy
// of the whole partition. Reading the partition in place costs one pass of
// sha256 over data the squashfs writer has just written (still in the page cache).
// The tests check kiln's bytes and root hash against veritysetup's own.
const (
	VerityBlock    = 4096
	verityDigest   = sha256.Size
	verityPerBlock = VerityBlock / verityDigest // digests per hash block
	veritySBSize   = 512
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

// verityLevels returns, for each level from the bottom, its size in hash
// blocks and its offset in blocks from the start of the tree.
func verityLevels(dataBlocks int64) (sizes, offsets []int64) {
	n := dataBlocks
	for {
		n = (n + verityPerBlock - 1) / verityPerBlock
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

// verityTreeSize is the size of superblock and tree for dataBlocks.
func verityTreeSize(dataBlocks int64) int64 {
	sizes, _ := verityLevels(dataBlocks)
	var n int64
	for _, s := range sizes {
		n += s
	}
	return VerityBlock + n*VerityBlock
}

// writeVerity hashes the first dataBlocks blocks of data and writes the
// superblock and tree at hashOffset of out. Level 0 is built streaming; each
// upper level is hashed from the level below as written (read back from out),
// so memory stays at a few blocks whatever the partition size.
//
// files, if not nil, is fed the data level as it is read (hashLevel0), and
// progress (may be nil) counts it.
func writeVerity(ctx context.Context, data io.ReaderAt, out interface {
	io.ReaderAt
	io.WriterAt
}, dataBlocks, hashOffset int64, salt []byte, id uuid.UUID, files *fileFeeder, progress io.Writer) (*Verity, error) {
	if dataBlocks < 2 { // veritysetup has no tree at all for one block
		return nil, errors.New("verity: fewer than 2 data blocks")
	}
	sb := veritySuperblock(dataBlocks, salt, id)
	if _, err := out.WriteAt(sb, hashOffset); err != nil {
		return nil, fmt.Errorf("write verity superblock: %w", err)
	}
	tree := hashOffset + VerityBlock
	sizes, offsets := verityLevels(dataBlocks)
	src, n := data, dataBlocks
	var srcOff int64
	for i := range sizes {
		dst := tree + offsets[i]*VerityBlock
		var err error
		if i == 0 {
			err = hashLevel0(ctx, src, n, salt, out, dst, files, progress)
		} else {
			err = hashLevel(src, srcOff, n, salt, out, dst)
		}
		if err != nil {
			return nil, err
		}
		src, srcOff, n = out, dst, sizes[i]
	}
	top := make([]byte, VerityBlock)
	if _, err := out.ReadAt(top, tree); err != nil {
		return nil, fmt.Errorf("read verity tree: %w", err)
	}
	return newVerity(saltedHash(salt, top), salt, dataBlocks, hashOffset, id), nil
}

func newVerity(root, salt []byte, dataBlocks, hashOffset int64, id uuid.UUID) *Verity {
	return &Verity{
		RootHash: hex.EncodeToString(root), Salt: hex.EncodeToString(salt),
		DataBlocks: dataBlocks, HashOffset: hashOffset, HashSize: verityTreeSize(dataBlocks), UUID: id.String(),
	}
}

// hashLevel hashes n blocks of src at off into hash blocks at dst, on every
// CPU: the level is cut into runs whose digests fill whole hash blocks, so
// each run writes its own part of dst. (sha256 is the build's cost of
// verity: one pass over the partition.)
func hashLevel(src io.ReaderAt, off, n int64, salt []byte, out io.WriterAt, dst int64) error {
	const run = 64 * verityPerBlock // blocks: 32 MiB of data, 64 hash blocks
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for from := int64(0); from < n; from += run {
		to := min(from+run, n)
		g.Go(func() error { return hashRun(src, off, from, to, n, salt, out, dst) })
	}
	return g.Wait()
}

// hashRun hashes blocks [from, to) of the n at off and writes their digests
// at dst+from*32 (from is a multiple of verityPerBlock: whole hash blocks);
// the run that ends the level pads its last hash block with zeros.
func hashRun(src io.ReaderAt, off, from, to, n int64, salt []byte, out io.WriterAt, dst int64) error {
	in := make([]byte, 256*VerityBlock) // read 1 MiB at a time
	hb := make([]byte, 0, 256*VerityBlock)
	pos := dst + from*verityDigest
	bh := newBlockHasher(salt)
	for i := from; i < to; {
		c := min(to-i, int64(len(in)/VerityBlock))
		if _, err := src.ReadAt(in[:c*VerityBlock], off+i*VerityBlock); err != nil {
			return fmt.Errorf("read block %d for the verity tree: %w", i, err)
		}
		hb = bh.appendBlocks(hb, in[:c*VerityBlock])
		i += c
		if len(hb) == cap(hb) || i == to {
			if pad := len(hb) % VerityBlock; pad != 0 && i == n {
				hb = append(hb, make([]byte, VerityBlock-pad)...)
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

// appendBlocks appends the salted digest of each whole VerityBlock of data
// to dst.
func (b *blockHasher) appendBlocks(dst, data []byte) []byte {
	for j := 0; j+VerityBlock <= len(data); j += VerityBlock {
		dst = b.appendHash(dst, data[j:j+VerityBlock])
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

// veritySuperblock is cryptsetup's on-disk verity superblock, version 1.
func veritySuperblock(dataBlocks int64, salt []byte, id uuid.UUID) []byte {
	b := make([]byte, veritySBSize)
	copy(b, "verity\x00\x00")
	binary.LittleEndian.PutUint32(b[8:], 1)  // superblock version
	binary.LittleEndian.PutUint32(b[12:], 1) // hash type: format 1
	copy(b[16:32], id[:])
	copy(b[32:64], "sha256")
	binary.LittleEndian.PutUint32(b[64:], VerityBlock)
	binary.LittleEndian.PutUint32(b[68:], VerityBlock)
	binary.LittleEndian.PutUint64(b[72:], uint64(dataBlocks))
	binary.LittleEndian.PutUint16(b[80:], uint16(len(salt)))
	copy(b[88:88+256], salt)
	return b
}

// VerityError is a verity check that failed; Block is the first bad data
// block (4 KiB, from the partition start) when the data is what is wrong,
// else -1 (the tree or its superblock is).
type VerityError struct {
	Block  int64
	Reason string
}

func (e *VerityError) Error() string {
	if e.Block >= 0 {
		return fmt.Sprintf("data block %d (bytes %d-%d of the partition) does not match the verity hash tree: %s",
			e.Block, e.Block*VerityBlock, (e.Block+1)*VerityBlock-1, e.Reason)
	}
	return e.Reason
}

// checkVerity checks part (the image partition) against v: the superblock is
// the one kiln writes for v, each level of the stored tree is the hash of the
// level below (level 0: of the data), and the top hashes to v.RootHash. It
// reads the partition once, streaming.
func checkVerity(ctx context.Context, part io.ReaderAt, v Verity) error {
	salt, err := hex.DecodeString(v.Salt)
	if err != nil || len(salt) > 256 {
		return &VerityError{-1, fmt.Sprintf("salt %q in the record is not hex of at most 256 bytes", v.Salt)}
	}
	id, err := uuid.Parse(v.UUID)
	if err != nil {
		return &VerityError{-1, fmt.Sprintf("verity UUID %q in the record: %v", v.UUID, err)}
	}
	if v.DataBlocks <= 0 || v.HashOffset != v.DataBlocks*VerityBlock {
		return &VerityError{-1, fmt.Sprintf("record says %d data blocks and the tree at byte %d: not a layout kiln writes", v.DataBlocks, v.HashOffset)}
	}
	sb := make([]byte, VerityBlock) // the superblock, then zeros to the tree
	if _, err := part.ReadAt(sb, v.HashOffset); err != nil {
		return &VerityError{-1, fmt.Sprintf("read verity superblock: %v", err)}
	}
	if !bytes.Equal(sb[:veritySBSize], veritySuperblock(v.DataBlocks, salt, id)) || !bytes.Equal(sb[veritySBSize:], make([]byte, VerityBlock-veritySBSize)) {
		return &VerityError{-1, fmt.Sprintf("verity superblock at byte %d of the partition is damaged", v.HashOffset)}
	}
	// Top down: the root hash proves the top block, each level the one
	// below, so a mismatch of data and level 0 means the data is damaged.
	tree := v.HashOffset + VerityBlock
	sizes, offsets := verityLevels(v.DataBlocks)
	top := make([]byte, VerityBlock)
	if _, err := part.ReadAt(top, tree+offsets[len(sizes)-1]*VerityBlock); err != nil {
		return &VerityError{-1, fmt.Sprintf("read verity tree: %v", err)}
	}
	if got := hex.EncodeToString(saltedHash(salt, top)); got != v.RootHash {
		return &VerityError{-1, fmt.Sprintf("the verity tree's root hash is %s, the record says %s: the tree's top block or the record is damaged, or they belong to different builds", got, v.RootHash)}
	}
	for i := len(sizes) - 1; i >= 0; i-- {
		stored := tree + offsets[i]*VerityBlock
		src, srcOff, n := io.ReaderAt(part), int64(0), v.DataBlocks
		if i > 0 {
			srcOff, n = tree+offsets[i-1]*VerityBlock, sizes[i-1]
		}
		bad, err := checkLevel(ctx, src, srcOff, n, salt, part, stored)
		switch {
		case err != nil:
			return err
		case bad < 0:
			continue
		case bad == n:
			return &VerityError{-1, fmt.Sprintf("verity hash tree level %d (at byte %d of the partition) is damaged: its padding is not zero", i, stored)}
		case i == 0:
			return &VerityError{bad, fmt.Sprintf("its hash differs from the tree's entry at byte %d", stored+bad*verityDigest)}
		default:
			return &VerityError{-1, fmt.Sprintf("verity hash tree level %d, block %d (byte %d of the partition) is damaged", i-1, bad, srcOff+bad*VerityBlock)}
		}
	}
	return nil
}

// checkLevel hashes n blocks of src at off and compares them with the stored
// hash blocks at stored (digests and zero padding); it returns the index of
// the first source block whose digest differs, the first block past n if
// only the padding differs, or -1.
func checkLevel(ctx context.Context, src io.ReaderAt, off, n int64, salt []byte, tree io.ReaderAt, stored int64) (int64, error) {
	in := make([]byte, 256*VerityBlock)
	want := make([]byte, 256*verityDigest)
	bh, got := newBlockHasher(salt), make([]byte, 0, verityDigest)
	for i := int64(0); i < n; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		c := min(n-i, int64(len(in)/VerityBlock))
		if _, err := src.ReadAt(in[:c*VerityBlock], off+i*VerityBlock); err != nil {
			return 0, &VerityError{-1, fmt.Sprintf("read block %d: %v", i, err)}
		}
		if _, err := tree.ReadAt(want[:c*verityDigest], stored+i*verityDigest); err != nil {
			return 0, &VerityError{-1, fmt.Sprintf("read verity tree: %v", err)}
		}
		for j := int64(0); j < c; j++ {
			if !bytes.Equal(bh.appendHash(got[:0], in[j*VerityBlock:(j+1)*VerityBlock]), want[j*verityDigest:(j+1)*verityDigest]) {
				return i + j, nil
			}
		}
		i += c
	}
	// The rest of the level's last hash block is zeros.
	if pad := (n * verityDigest) % VerityBlock; pad != 0 {
		rest := make([]byte, VerityBlock-pad)
		if _, err := tree.ReadAt(rest, stored+n*verityDigest); err != nil {
			return 0, &VerityError{-1, fmt.Sprintf("read verity tree: %v", err)}
		}
		if !bytes.Equal(rest, make([]byte, len(rest))) {
			return n, nil
		}
	}
	return -1, nil
}
