package registry

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/kiln-appliance/kiln/internal/human"
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

// checkSize fails for a file larger than limit, naming both sizes: a
// reader cut at the limit would only say "unexpected EOF", as if the file
// were damaged rather than too large.
func checkSize(f *os.File, limit int64) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > limit {
		return fmt.Errorf("%s is %d bytes, over the limit of %d (%s)", f.Name(), fi.Size(), limit, human.Bytes(limit))
	}
	return nil
}

// readRegular reads path as openRegular opens it, up to max+1 bytes (so
// the caller sees a file longer than max), with plain system calls: at
// start the registry reads every manifest once, and an *os.File costs each
// three more calls (the poller's fcntl and epoll_ctl) than open, fstat,
// read, close. Anything but a regular file gets openRegular's error.
func readRegular(path string, max int64) ([]byte, error) {
	fd, err := ignoringEINTR(func() (int, error) {
		return syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	})
	if err != nil {
		if _, err := openRegular(path); err != nil {
			return nil, err // the same error the server gives for it elsewhere
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		f, err := openRegular(path)
		if err == nil { // replaced in between: still not read
			f.Close()
			err = fmt.Errorf("%s: %w (changed while read)", path, errNotRegular)
		}
		return nil, err
	}
	buf := make([]byte, min(st.Size, max+1)) // one read for a file of the size fstat gave
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
