package partitions

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// squashfsDataStart is where mksquashfs starts the file contents: right
// after the 96-byte superblock (no compressor options are stored).
const squashfsDataStart = 96

// FileOffsets returns where each regular file's contents start in the
// filesystem WriteFilesystem wrote uncompressed from tree at offset in disk,
// by slash path relative to tree. mksquashfs stores the contents one file
// after the other from the end of the superblock, depth first, each
// directory's entries in byte order (the order squashfs directories keep),
// which is filepath.WalkDir's order. That is checked against the written
// filesystem, not assumed: the contents must end where the inode table
// starts and every file's first and last bytes must be where the offset
// says, so a mksquashfs that lays files out otherwise fails here rather than
// giving a bundle the node would refuse.
func FileOffsets(tree, disk string, offset int64) (map[string]int64, error) {
	d, err := os.Open(disk)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	sb := make([]byte, squashfsDataStart)
	if _, err := d.ReadAt(sb, offset); err != nil {
		return nil, fmt.Errorf("read squashfs superblock: %w", err)
	}
	inodeTable := int64(binary.LittleEndian.Uint64(sb[64:72]))
	offsets := map[string]int64{}
	at := int64(squashfsDataStart)
	err = filepath.WalkDir(tree, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(tree, p)
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		if err := sameEnds(p, d, offset+at, info.Size()); err != nil {
			return fmt.Errorf("squashfs layout: %s is not at byte %d of the filesystem as kiln expects of mksquashfs (%w)", rel, at, err)
		}
		offsets[filepath.ToSlash(rel)] = at
		at += info.Size()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if at != inodeTable {
		return nil, fmt.Errorf("squashfs layout: file contents end at byte %d, the inode table starts at %d; mksquashfs stored them otherwise than kiln expects (uncompressed, no sparse blocks)", at, inodeTable)
	}
	return offsets, nil
}

// sameEnds compares the first and last (up to) 4 KiB of file p with the n
// bytes at off in disk.
func sameEnds(p string, disk *os.File, off, n int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	k := min(n, 4096)
	a, b := make([]byte, k), make([]byte, k)
	for _, at := range []int64{0, n - k} {
		if _, err := f.ReadAt(a, at); err != nil {
			return err
		}
		if _, err := disk.ReadAt(b, off+at); err != nil {
			return err
		}
		if !bytes.Equal(a, b) {
			return fmt.Errorf("bytes %d-%d differ", at, at+k-1)
		}
	}
	return nil
}
