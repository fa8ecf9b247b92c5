package builder

import (
	"errors"
	"io"
	"io/fs"
)

// TEMPORARY until partitions.OpenImagePartition lands.
func openImagePartition(disk string) (fs.FS, io.Closer, error) {
	return nil, nil, errors.New("not yet")
}
