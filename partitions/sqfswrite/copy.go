package sqfswrite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/progress"
)

// copyChunk bounds one copy_file_range call: cancellation and progress are
// seen at least this often.
const copyChunk = 16 << 20

// copier copies files' contents into out, in the kernel where it can.
type copier struct {
	out      *os.File
	progress io.Writer // counts the bytes copied
	buf      []byte    // for copies through user space, allocated on first use
}

// copyFile copies the size bytes of the file at path into c.out at at, in
// the kernel. Holes of the source are skipped (out is written past its end,
// so they stay holes there and read as zeros).
func (c *copier) copyFile(ctx context.Context, at int64, path string, size int64) error {
	out := c.out
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("squashfs: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("squashfs: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() != size {
		return fmt.Errorf("squashfs: %s changed while the filesystem was written (was a %d-byte file, now %v of %d bytes): write it again from a tree nothing else changes", path, size, st.Mode().Type(), st.Size())
	}
	in, dst := int(f.Fd()), int(out.Fd())
	refused := false // the kernel refused copy_file_range for this pair
	for pos := int64(0); pos < size; {
		data, err := unix.Seek(in, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // a hole to the end
			progress.Count(c.progress, size-pos)
			return nil
		}
		if err != nil { // SEEK_DATA unsupported: copy everything
			data = pos
		}
		end := size
		if data > pos {
			progress.Count(c.progress, min(data, size)-pos)
			pos = min(data, size)
		}
		if hole, err := unix.Seek(in, pos, unix.SEEK_HOLE); err == nil && hole > pos && hole < end {
			end = hole
		}
		for pos < end {
			if err := ctx.Err(); err != nil {
				return err
			}
			roff, woff := pos, at+pos
			var n int
			var err error = unix.EXDEV
			if !refused {
				n, err = unix.CopyFileRange(in, &roff, dst, &woff, int(min(end-pos, copyChunk)), 0)
			}
			if err != nil && fallback(err) {
				refused = true
				n, err = c.copyUser(f, pos, at+pos, min(end-pos, copyChunk))
			}
			if err != nil {
				return fmt.Errorf("squashfs: copy %s: %w", path, err)
			}
			if n == 0 {
				return fmt.Errorf("squashfs: %s ended at byte %d of %d: it shrank while the filesystem was written", path, pos, size)
			}
			progress.Count(c.progress, int64(n))
			pos += int64(n)
		}
	}
	return nil
}

// fallback says whether the kernel refused copy_file_range between these
// two files (different filesystems, or one that does not support it), not
// that the copy failed.
func fallback(err error) bool {
	return errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) ||
		errors.Is(err, unix.EOPNOTSUPP)
}

// copyUser copies up to n bytes of in at from to c.out at to through user
// space, where the kernel refuses.
func (c *copier) copyUser(in *os.File, from, to, n int64) (int, error) {
	if c.buf == nil {
		c.buf = make([]byte, 1<<20)
	}
	b := c.buf[:min(n, int64(len(c.buf)))]
	r, err := in.ReadAt(b, from)
	if r == 0 && err != nil {
		if err == io.EOF {
			return 0, nil
		}
		return 0, err
	}
	w, err := c.out.WriteAt(b[:r], to)
	return w, err
}
