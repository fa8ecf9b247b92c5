// Package inputfile opens the files kiln reads as input (recipes, locks,
// base images, disks, keys, the files of image layouts) so that no input
// can hang it. A plain open of a FIFO waits for a writer, and a read of
// one, a terminal or a socket waits for data; both wait inside a system
// call, where Ctrl-C and SIGTERM only cancel a context nobody looks at.
// Open opens without blocking (O_NONBLOCK), looks at what it opened
// (fstat) and refuses anything but a regular file or a block device,
// which never block.
package inputfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ErrNotFile is wrapped by the error of an input that is neither a regular
// file nor a block device.
var ErrNotFile = errors.New("not a regular file or block device")

// NotFileError is an input of the wrong type.
type NotFileError struct {
	Path    string
	Mode    fs.FileMode // its type bits
	Devices bool        // a block device would have done (Open)
}

func (e *NotFileError) Error() string {
	want := "a regular file"
	if e.Devices {
		want = "a regular file or block device"
	}
	return fmt.Sprintf("%s is %s, not %s", e.Path, describe(e.Mode), want)
}

func (e *NotFileError) Unwrap() error { return ErrNotFile }

// describe names a file type for a technician.
func describe(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return fmt.Sprintf("a special file (%v)", m.Type())
}

// Open opens path (following symlinks) for reading, and returns it only if
// it is a regular file or a block device; anything else is a
// *NotFileError, closed again without having been read.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if m := fi.Mode(); !m.IsRegular() && (m&fs.ModeDevice == 0 || m&fs.ModeCharDevice != 0) {
		f.Close()
		return nil, &NotFileError{Path: path, Mode: m.Type(), Devices: true}
	}
	return f, nil
}

// OpenFile is Open for inputs that must be regular files (a block device
// is refused too).
func OpenFile(path string) (*os.File, error) {
	f, err := Open(path)
	var nf *NotFileError
	if errors.As(err, &nf) {
		nf.Devices = false
	}
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, err
		}
		return nil, &NotFileError{Path: path, Mode: fi.Mode().Type()}
	}
	return f, nil
}

// ReadFile reads the regular file at path, refusing one larger than limit
// bytes with a *TooLargeError (limit < 0: no limit).
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := io.Reader(f)
	if limit >= 0 {
		r = io.LimitReader(f, limit+1)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if limit >= 0 && int64(len(data)) > limit {
		return nil, &TooLargeError{Path: path, Limit: limit}
	}
	return data, nil
}

// TooLargeError is a file read with ReadFile that is over its limit.
type TooLargeError struct {
	Path  string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than %d bytes", e.Path, e.Limit)
}

// Check says whether path could be opened as an input (Open), without
// keeping it open: for inputs a library opens by name.
func Check(path string) error {
	f, err := Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}
