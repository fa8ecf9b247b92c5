package partitions

import (
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

// OpenSquashfs opens the squashfs at offset in the file at path (size bytes)
// as an fs.FS, read with go-diskfs's reader: no root, no loop device.
func OpenSquashfs(path string, offset, size int64) (fs.FS, io.Closer, error) {
	f, err := openDisk(path)
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
