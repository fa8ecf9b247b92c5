package registry

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// errNotRegular marks a layout file that is not a regular file: a symlink
// (which could point anywhere), a FIFO, a device, a directory. The server
// reads only regular files, so nothing outside the layout is ever served.
var errNotRegular = errors.New("not a regular file")

// openRegular opens path for reading without following a final symlink
// (O_NOFOLLOW) and without blocking on a FIFO (O_NONBLOCK, which regular
// files ignore), and fails with errNotRegular unless it is a regular file.
// The directories above it come from the layout walk, and the layout is on
// a read-only partition.
func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: %w (a symlink)", path, errNotRegular)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w (%s)", path, errNotRegular, fi.Mode().Type())
	}
	return f, nil
}
