package partitions

import (
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/squashfs"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// OpenImagePartition opens the image partition of a kiln disk as an fs.FS,
// read with go-diskfs's squashfs reader, so `kiln inspect` and `kiln verify`
// need neither root nor a loop device. (Only go-diskfs's squashfs *writer*
// is broken; its reader is checked against the kernel's in the tests.)
func OpenImagePartition(disk string) (fs.FS, io.Closer, error) {
	layout, err := Inspect(disk)
	if err != nil {
		return nil, nil, err
	}
	p, ok := layout.Find(contract.PartitionName)
	if !ok {
		return nil, nil, fmt.Errorf("%s has no %s partition (partitions: %s)", disk, contract.PartitionName, layout.names())
	}
	if p.Filesystem != FSSquashfs {
		return nil, nil, fmt.Errorf("%s: partition %d (%s) holds no squashfs filesystem: damaged, or not built by kiln", disk, p.Number, contract.PartitionName)
	}
	f, err := os.Open(disk)
	if err != nil {
		return nil, nil, err
	}
	sq, err := squashfs.Read(file.New(f, true), p.Size, p.Offset, 0)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: read image partition: %w", disk, err)
	}
	// The default 128 MB block cache only helps random access; verify reads
	// each 1 MiB block once, in order.
	sq.SetCacheSize(16 << 20)
	return sq, f, nil
}
