package partitions

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/squashfs"
	"github.com/diskfs/go-diskfs/partition/gpt"
)

// StickStart is where a stick image's one partition starts (1 MiB, as
// partitioning tools align).
const StickStart = MiB

// FilesystemOptions is one squashfs written for a bundle.
type FilesystemOptions struct {
	Tree            string // directory to pack
	Disk            string // file to write into (mksquashfs truncates it first)
	Offset          int64  // byte offset in Disk
	Compression     string // "" or "none", "zstd", "gzip", "xz", "lz4"
	SourceDateEpoch int64
	Progress        Reporter // may be nil
}

// WriteFilesystem packs the tree into Disk at Offset as a read-only squashfs,
// every file owned by root, and returns the filesystem's size (a multiple
// of 4 KiB). It is the image partition's writer (docs/FILESYSTEM.md). Sparse
// blocks are stored as data: uncompressed, every file's contents are one
// byte range of the filesystem (SquashfsDataStart, then file after file).
func WriteFilesystem(ctx context.Context, o FilesystemOptions) (int64, error) {
	return writeSquashfs(ctx, squashfsOptions{
		Tree: o.Tree, Disk: o.Disk, Offset: o.Offset, Compression: o.Compression,
		SourceDateEpoch: o.SourceDateEpoch, Progress: o.Progress, AllRoot: true, Contiguous: true,
	})
}

// The stick's partition holds exactly the bundle's bytes (a multiple of
// 4 KiB); the backup GPT (33 sectors) follows it, padded to 4 KiB. No MiB
// rounding: on a delta of a few hundred MiB that would be measurable overhead.
const stickAlign = 4096

// StickPartitionEnd is where a stick image's partition of content bytes ends.
func StickPartitionEnd(content int64) int64 { return StickStart + alignUp(content, stickAlign) }

// StickSize is the size of a stick image whose partition holds content bytes.
func StickSize(content int64) int64 { return StickPartitionEnd(content) + alignUp(33*512, stickAlign) }

// WriteStickTable writes the GPT of a stick image of StickSize(content)
// bytes: one partition of the given type and name from StickStart, with
// GUIDs derived from seed. The file is grown to its size.
func WriteStickTable(f *os.File, content int64, partType, name string, seed []byte) error {
	size := StickSize(content)
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("grow stick image to %s: %w", human(size), err)
	}
	t := &gpt.Table{
		LogicalSectorSize:  512,
		PhysicalSectorSize: 512,
		ProtectiveMBR:      true,
		GUID:               DeriveGUID(seed, "disk"),
		Partitions: []*gpt.Partition{{
			Index: 1,
			Start: uint64(StickStart / 512),
			End:   uint64(StickPartitionEnd(content)/512 - 1),
			Type:  gpt.Type(partType),
			Name:  name,
			GUID:  DeriveGUID(seed, name),
		}},
	}
	if err := t.Write(f, size); err != nil {
		return fmt.Errorf("write stick partition table: %w", err)
	}
	return nil
}

// TreeSize is the total size of the regular files under root.
func TreeSize(root string) (int64, error) { return treeSize(root) }

// OpenSquashfs opens the squashfs at offset in the file at path (size bytes)
// as an fs.FS, read with go-diskfs's reader: no root, no loop device.
func OpenSquashfs(path string, offset, size int64) (fs.FS, io.Closer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	sq, err := squashfs.Read(file.New(f, true), size, offset, 0)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: read squashfs at byte %d: %w", path, offset, err)
	}
	sq.SetCacheSize(16 << 20)
	return sq, f, nil
}
