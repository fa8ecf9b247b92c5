package seal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// zeroBlock stands in for the bytes of a hole: hashing it costs sha256's
// CPU but no read (a hole read still fills a zero page-cache page per 4 KiB).
var zeroBlock [mib]byte

// hashHoles feeds h the bytes of f in s, answering f's holes from
// zeroBlock instead of reading them (SEEK_DATA/SEEK_HOLE; the digest is the
// same as of a plain read). Data regions are read into buf. Only the file
// offset is touched besides reads (pread), so goroutines may share f.
// Where holes cannot be told (a block device, a filesystem without
// SEEK_DATA), every byte is read.
func hashHoles(ctx context.Context, h io.Writer, f *os.File, s span, buf []byte) error {
	off, size := s.off, s.size
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Mode().IsRegular() && off+size > fi.Size() { // a hole is never past the end
		return fmt.Errorf("bytes %d-%d lie past the end of the disk (%d bytes): it is truncated", off, off+size-1, fi.Size())
	}
	fd := int(f.Fd())
	for end := off + size; off < end; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data from off to the end of the file
			data = end
		} else if err != nil {
			return hashRead(ctx, h, f, span{off, end - off}, buf)
		}
		if data = min(data, end); data > off {
			writeZeros(h, data-off)
			off = data
			continue
		}
		hole, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err != nil {
			return hashRead(ctx, h, f, span{off, end - off}, buf)
		}
		hole = min(max(hole, off+1), end)
		if err := hashRead(ctx, h, f, span{off, hole - off}, buf); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// writeZeros feeds h n zero bytes, from memory, or as a count where h
// takes one (the seal's chunked digest: a constant per chunk of zeros).
func writeZeros(h io.Writer, n int64) {
	if z, ok := h.(interface{ WriteZeros(int64) }); ok {
		z.WriteZeros(n)
		return
	}
	for n > 0 {
		c := min(n, int64(len(zeroBlock)))
		h.Write(zeroBlock[:c])
		n -= c
	}
}

// hashRead feeds h the bytes of r in s, read into buf, and stops with
// ctx's error once ctx is done (looked at every readStride bytes):
// verifying a large disk reads for minutes, which Ctrl-C must cut short.
func hashRead(ctx context.Context, h io.Writer, r io.ReaderAt, s span, buf []byte) error {
	off, size := s.off, s.size
	for done := int64(0); done < size; done += readStride {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := io.CopyBuffer(h, io.NewSectionReader(r, off+done, min(readStride, size-done)), buf); err != nil {
			return err
		}
	}
	return nil
}

// readStride is how much hashRead reads between looks at its context: a
// tenth of a second's reading.
const readStride = 64 * mib
