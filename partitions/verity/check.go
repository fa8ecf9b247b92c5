package verity

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/google/uuid"
)

// Error is a verity check that failed; Block is the first bad data
// block (4 KiB, from the partition start) when the data is what is wrong,
// else -1 (the tree or its superblock is).
type Error struct {
	Block  int64
	Reason string
}

func (e *Error) Error() string {
	if e.Block >= 0 {
		return fmt.Sprintf("data block %d (bytes %d-%d of the partition) does not match the verity hash tree: %s",
			e.Block, e.Block*Block, (e.Block+1)*Block-1, e.Reason)
	}
	return e.Reason
}

// Check checks part (the image partition) against v: the superblock is
// the one kiln writes for v, each level of the stored tree is the hash of the
// level below (level 0: of the data), and the top hashes to v.RootHash. It
// reads the partition once, streaming, and stops when ctx is done.
func Check(ctx context.Context, part io.ReaderAt, v Verity) error {
	salt, err := hex.DecodeString(v.Salt)
	if err != nil || len(salt) > 256 {
		return &Error{-1, fmt.Sprintf("salt %q in the record is not hex of at most 256 bytes", v.Salt)}
	}
	id, err := uuid.Parse(v.UUID)
	if err != nil {
		return &Error{-1, fmt.Sprintf("verity UUID %q in the record: %v", v.UUID, err)}
	}
	if v.DataBlocks <= 0 || v.HashOffset != v.DataBlocks*Block {
		return &Error{-1, fmt.Sprintf("record says %d data blocks and the tree at byte %d: not a layout kiln writes", v.DataBlocks, v.HashOffset)}
	}
	sb := make([]byte, Block) // the superblock, then zeros to the tree
	if _, err := part.ReadAt(sb, v.HashOffset); err != nil {
		return &Error{-1, fmt.Sprintf("read verity superblock: %v", err)}
	}
	if !bytes.Equal(sb[:sbSize], superblock(v.DataBlocks, salt, id)) || !bytes.Equal(sb[sbSize:], make([]byte, Block-sbSize)) {
		return &Error{-1, fmt.Sprintf("verity superblock at byte %d of the partition is damaged", v.HashOffset)}
	}
	return checkTree(ctx, part, part, v.HashOffset+Block, v.DataBlocks, salt, v.RootHash)
}

// checkTree checks dataBlocks blocks of data against the tree at treeOff of
// tree (top level first, as Tree.Write and veritysetup lay it out) and the
// tree against rootHash.
func checkTree(ctx context.Context, data, tree io.ReaderAt, treeOff, dataBlocks int64, salt []byte, rootHash string) error {
	// Top down: the root hash proves the top block, each level the one
	// below, so a mismatch of data and level 0 means the data is damaged.
	sizes, offsets := levels(dataBlocks)
	top := make([]byte, Block)
	if _, err := tree.ReadAt(top, treeOff+offsets[len(sizes)-1]*Block); err != nil {
		return &Error{-1, fmt.Sprintf("read verity tree: %v", err)}
	}
	if got := hex.EncodeToString(saltedHash(salt, top)); got != rootHash {
		return &Error{-1, fmt.Sprintf("the verity tree's root hash is %s, the record says %s: the tree's top block or the record is damaged, or they belong to different builds", got, rootHash)}
	}
	for i := len(sizes) - 1; i >= 0; i-- {
		l := level{src: data, n: dataBlocks, salt: salt, hashes: treeOff + offsets[i]*Block}
		if i > 0 {
			l.src, l.off, l.n = tree, treeOff+offsets[i-1]*Block, sizes[i-1]
		}
		stored, srcOff, n := l.hashes, l.off, l.n
		bad, err := l.check(ctx, tree)
		switch {
		case err != nil:
			return err
		case bad < 0:
			continue
		case bad == n:
			return &Error{-1, fmt.Sprintf("verity hash tree level %d (at byte %d of the partition) is damaged: its padding is not zero", i, stored)}
		case i == 0:
			return &Error{bad, fmt.Sprintf("its hash differs from the tree's entry at byte %d", stored+bad*digest)}
		default:
			return &Error{-1, fmt.Sprintf("verity hash tree level %d, block %d (byte %d of the partition) is damaged", i-1, bad, srcOff+bad*Block)}
		}
	}
	return nil
}

// check hashes the level and compares its digests with those stored in
// tree at l.hashes (and the zero padding after them); it returns the index
// of the first source block whose digest differs, the first block past n if
// only the padding differs, or -1.
func (l level) check(ctx context.Context, tree io.ReaderAt) (int64, error) {
	src, off, n, stored := l.src, l.off, l.n, l.hashes
	in := make([]byte, readChunk)
	want := make([]byte, hashChunk*digest)
	bh, got := newBlockHasher(l.salt), make([]byte, 0, digest)
	for i := int64(0); i < n; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		c := min(n-i, int64(len(in)/Block))
		if _, err := src.ReadAt(in[:c*Block], off+i*Block); err != nil {
			return 0, &Error{-1, fmt.Sprintf("read block %d: %v", i, err)}
		}
		if _, err := tree.ReadAt(want[:c*digest], stored+i*digest); err != nil {
			return 0, &Error{-1, fmt.Sprintf("read verity tree: %v", err)}
		}
		for j := int64(0); j < c; j++ {
			if !bytes.Equal(bh.appendHash(got[:0], in[j*Block:(j+1)*Block]), want[j*digest:(j+1)*digest]) {
				return i + j, nil
			}
		}
		i += c
	}
	// The rest of the level's last hash block is zeros.
	if pad := (n * digest) % Block; pad != 0 {
		rest := make([]byte, Block-pad)
		if _, err := tree.ReadAt(rest, stored+n*digest); err != nil {
			return 0, &Error{-1, fmt.Sprintf("read verity tree: %v", err)}
		}
		if !bytes.Equal(rest, make([]byte, len(rest))) {
			return n, nil
		}
	}
	return -1, nil
}
