package verity

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/google/uuid"
)

// ReadSlot reads the hash partition of an OS slot as `veritysetup format
// DATA HASH` lays it out (the superblock at its start, the tree one block
// after it), checks the slot's data against it and rootHash (as its boot
// entry names it), and returns the tree's values: the salt, UUID and data
// blocks a node formats its own slot's hash partition with. Only format 1
// with sha256 and 4 KiB blocks is read (veritysetup's defaults, and what
// Tree writes). It reads the data once, streaming.
func ReadSlot(ctx context.Context, data, hash io.ReaderAt, rootHash string) (*Verity, error) {
	v, salt, err := readSuperblock(hash)
	if err != nil {
		return nil, err
	}
	v.RootHash = rootHash
	if err := checkTree(ctx, data, hash, Block, v.DataBlocks, salt, rootHash); err != nil {
		return nil, err
	}
	return v, nil
}

// readSuperblock parses cryptsetup's on-disk superblock (superblock writes
// it) at the start of hash.
func readSuperblock(hash io.ReaderAt) (*Verity, []byte, error) {
	b := make([]byte, sbSize)
	if _, err := hash.ReadAt(b, 0); err != nil {
		return nil, nil, fmt.Errorf("read verity superblock: %w", err)
	}
	if !bytes.Equal(b[:8], []byte("verity\x00\x00")) {
		return nil, nil, &Error{-1, "no dm-verity superblock at the start of the hash partition (veritysetup format writes one)"}
	}
	le := binary.LittleEndian
	version, hashType := le.Uint32(b[8:]), le.Uint32(b[12:])
	alg := string(bytes.TrimRight(b[32:64], "\x00"))
	dataBlock, hashBlock := le.Uint32(b[64:]), le.Uint32(b[68:])
	dataBlocks, saltSize := int64(le.Uint64(b[72:])), int(le.Uint16(b[80:]))
	switch {
	case version != 1 || hashType != 1 || alg != "sha256" || dataBlock != Block || hashBlock != Block:
		return nil, nil, &Error{-1, fmt.Sprintf("dm-verity superblock version %d, format %d, hash %q, blocks %d/%d: kiln's slots are version 1, format 1, sha256, %d/%d (veritysetup format's defaults)",
			version, hashType, alg, dataBlock, hashBlock, Block, Block)}
	case saltSize > 256:
		return nil, nil, &Error{-1, fmt.Sprintf("dm-verity superblock: salt of %d bytes (at most 256)", saltSize)}
	case dataBlocks < 2 || dataBlocks > 1<<40/Block:
		return nil, nil, &Error{-1, fmt.Sprintf("dm-verity superblock: %d data blocks", dataBlocks)}
	}
	id, err := uuid.FromBytes(b[16:32])
	if err != nil {
		return nil, nil, err
	}
	salt := bytes.Clone(b[88 : 88+saltSize])
	return &Verity{Salt: hex.EncodeToString(salt), UUID: id.String(), DataBlocks: dataBlocks, HashSize: TreeSize(dataBlocks)}, salt, nil
}
