package sqfswrite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyChunk bounds one copy_file_range call: cancellation and progress are
// seen at least this often.
const copyChunk = 16 << 20

// copyFile copies the size bytes of the file at path into out at at, in
// the kernel. Holes of the source are skipped (out is written past its end,
// so they stay holes there and read as zeros).
func copyFile(ctx context.Context, out *os.File, at int64, path string, size int64, progress io.Writer) error {
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
	var buf []byte
	for pos := int64(0); pos < size; {
		data, err := unix.Seek(in, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // a hole to the end
			countBytes(progress, size-pos)
			return nil
		}
		if err != nil { // SEEK_DATA unsupported: copy everything
			data = pos
		}
		end := size
		if data > pos {
			countBytes(progress, min(data, size)-pos)
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
			if buf == nil { // the kernel has not refused this pair yet
				n, err = unix.CopyFileRange(in, &roff, dst, &woff, int(min(end-pos, copyChunk)), 0)
			}
			if err != nil && fallback(err) {
				n, err = copyUser(f, out, pos, at+pos, min(end-pos, copyChunk), &buf)
			}
			if err != nil {
				return fmt.Errorf("squashfs: copy %s: %w", path, err)
			}
			if n == 0 {
				return fmt.Errorf("squashfs: %s ended at byte %d of %d: it shrank while the filesystem was written", path, pos, size)
			}
			countBytes(progress, int64(n))
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

// copyUser copies up to n bytes through user space, where the kernel
// refuses, with a buffer allocated on first use.
func copyUser(in, out *os.File, from, to, n int64, buf *[]byte) (int, error) {
	if *buf == nil {
		*buf = make([]byte, 1<<20)
	}
	b := (*buf)[:min(n, int64(len(*buf)))]
	r, err := in.ReadAt(b, from)
	if r == 0 && err != nil {
		if err == io.EOF {
			return 0, nil
		}
		return 0, err
	}
	w, err := out.WriteAt(b[:r], to)
	return w, err
}

var zeros [64 << 10]byte

// countBytes adds n to progress without allocating n bytes.
func countBytes(w io.Writer, n int64) {
	for n > 0 {
		c := min(n, int64(len(zeros)))
		w.Write(zeros[:c])
		n -= c
	}
}
