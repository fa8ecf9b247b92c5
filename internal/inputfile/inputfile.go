// Package inputfile opens the files kiln reads as input (recipes, locks,
// base images, disks, keys, the files of image layouts; on the node, the
// files its registry serves and its release state) so that no input can
// hang it. A plain open of a FIFO waits for a writer, and a read of
// one, a terminal or a socket waits for data; both wait inside a system
// call, where Ctrl-C and SIGTERM only cancel a context nobody looks at.
// Open opens without blocking (O_NONBLOCK), looks at what it opened
// (fstat) and refuses anything but a regular file or a block device,
// which never block; with NoFollow, a symlink too.
package inputfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/kiln-appliance/kiln/internal/human"
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
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return fmt.Sprintf("a special file (%v)", m.Type())
}

// Option changes what an open accepts.
type Option func(*options)

type options struct{ flags int }

// NoFollow refuses a symlink as the last component of the path (O_NOFOLLOW),
// as a *NotFileError: for the files of a tree kiln serves or reads on the
// node, where a link could point anywhere on the host.
func NoFollow() Option { return func(o *options) { o.flags |= syscall.O_NOFOLLOW } }

func flags(opts []Option) int {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return syscall.O_RDONLY | syscall.O_NONBLOCK | syscall.O_CLOEXEC | o.flags
}

// Open opens path (following symlinks, unless NoFollow) for reading, and
// returns it only if it is a regular file or a block device; anything else
// is a *NotFileError, closed again without having been read.
func Open(path string, opts ...Option) (*os.File, error) {
	f, err := os.OpenFile(path, flags(opts), 0)
	if errors.Is(err, syscall.ELOOP) && flags(opts)&syscall.O_NOFOLLOW != 0 {
		return nil, &NotFileError{Path: path, Mode: fs.ModeSymlink, Devices: true}
	}
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
func OpenFile(path string, opts ...Option) (*os.File, error) {
	f, err := Open(path, opts...)
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

// ReadFile reads the regular file at path (as OpenFile opens it), refusing
// one larger than limit bytes with a *TooLargeError (limit < 0: no limit).
// It reads as many bytes as the file had when it was opened, with plain
// system calls (open, fstat, read, close): the node's registry reads every
// manifest of a layout it indexes at start, and an *os.File costs each
// three calls more (the poller's).
func ReadFile(path string, limit int64, opts ...Option) ([]byte, error) {
	fd, err := ignoringEINTR(func() (int, error) { return syscall.Open(path, flags(opts), 0) })
	if err != nil {
		if _, err := OpenFile(path, opts...); err != nil {
			return nil, err // the error OpenFile gives it
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		f, err := OpenFile(path, opts...)
		if err == nil { // replaced in between: still not read
			f.Close()
			err = fmt.Errorf("%s changed while it was opened: %w", path, ErrNotFile)
		}
		return nil, err
	}
	if limit >= 0 && st.Size > limit {
		return nil, &TooLargeError{Path: path, Size: st.Size, Limit: limit}
	}
	buf := make([]byte, st.Size) // one read for a file of the size fstat gave
	n := 0
	for n < len(buf) {
		m, err := ignoringEINTR(func() (int, error) { return syscall.Read(fd, buf[n:]) })
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return buf[:n], nil
}

func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != syscall.EINTR {
			return n, err
		}
	}
}

// TooLargeError is a file that is over the limit it was read with.
type TooLargeError struct {
	Path        string
	Size, Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is %d bytes, over the limit of %d (%s)", e.Path, e.Size, e.Limit, human.Bytes(e.Limit))
}

// CheckSize refuses an open file larger than limit with a *TooLargeError:
// for a file read as a stream, which a reader cut at the limit would call
// damaged ("unexpected EOF") rather than too large.
func CheckSize(f *os.File, limit int64) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > limit {
		return &TooLargeError{Path: f.Name(), Size: fi.Size(), Limit: limit}
	}
	return nil
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
