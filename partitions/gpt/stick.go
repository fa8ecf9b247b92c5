package gpt

import (
	"fmt"
	"os"

	diskgpt "github.com/diskfs/go-diskfs/partition/gpt"
)

// StickStart is where a stick image's one partition starts (1 MiB, as
// partitioning tools align).
const StickStart = 1 << 20

// The stick's partition holds exactly the bundle's bytes (a multiple of
// 4 KiB); the backup GPT (33 sectors) follows it, padded to 4 KiB. No MiB
// rounding: on a delta of a few hundred MiB that would be measurable overhead.
const stickAlign = 4096

// StickPartitionEnd is where a stick image's partition of content bytes ends.
func StickPartitionEnd(content int64) int64 { return StickStart + align(content) }

// StickSize is the size of a stick image whose partition holds content bytes.
func StickSize(content int64) int64 { return StickPartitionEnd(content) + align(33*512) }

func align(n int64) int64 { return (n + stickAlign - 1) / stickAlign * stickAlign }

// WriteStick writes the GPT of a stick image of StickSize(content) bytes:
// one partition of the given type and name from StickStart, with GUIDs
// derived from seed. The file is grown to its size.
func WriteStick(f *os.File, content int64, partType, name string, seed []byte) error {
	size := StickSize(content)
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("grow stick image to %d bytes: %w", size, err)
	}
	t := &diskgpt.Table{
		LogicalSectorSize:  512,
		PhysicalSectorSize: 512,
		ProtectiveMBR:      true,
		GUID:               DeriveGUID(seed, "disk"),
		Partitions: []*diskgpt.Partition{{
			Index: 1,
			Start: uint64(StickStart / 512),
			End:   uint64(StickPartitionEnd(content)/512 - 1),
			Type:  diskgpt.Type(partType),
			Name:  name,
			GUID:  DeriveGUID(seed, name),
		}},
	}
	if err := t.Write(f, size); err != nil {
		return fmt.Errorf("write stick partition table: %w", err)
	}
	return nil
}
