package partitions

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/partitions/base"
)

// segment is a byte range of the base and where it goes on the disk.
type segment struct{ src, size, dst int64 }

// copyBase streams the base and writes the bytes of each segment to its
// place, leaving holes where the base is zero; the base is read to its end
// so its digest is checked.
func (a *assembly) copyBase(ctx context.Context) (err error) {
	segs := a.geo.segments()
	var n int64 // bytes of the base needed
	for _, s := range segs {
		n = max(n, s.src+s.size)
	}
	b, err := base.Open(a.d.Base.Path, a.d.Base.Digest)
	if err != nil {
		return err
	}
	defer b.Close()
	task := a.progress.Task("copy base partitions", n)
	defer func() { task.Done(err) }()

	buf := make([]byte, MiB)
	var off int64
	for off < n {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := io.ReadFull(b, buf[:min(int64(len(buf)), n-off)])
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF { // a short raw file, not a decoder error
				return fmt.Errorf("base image %s ends at %s, before the end of its last partition at %s: it is truncated", a.d.Base.Path, human(off+int64(m)), human(n))
			}
			return err
		}
		for _, s := range segs {
			lo, hi := max(off, s.src), min(off+int64(m), s.src+s.size)
			if lo < hi {
				if err := writeSparse(a.out, buf[lo-off:hi-off], s.dst+lo-s.src); err != nil {
					return err
				}
			}
		}
		off += int64(m)
		task.Write(buf[:m])
	}
	if _, err := io.Copy(io.Discard, b); err != nil {
		return err
	}
	return nil
}

// writeSparse writes p at off, skipping all-zero 64 KiB runs (the output
// starts as a hole, so they read back as zeros anyway).
func writeSparse(f *os.File, p []byte, off int64) error {
	const chunk = 64 << 10
	var zero [chunk]byte
	for i := 0; i < len(p); i += chunk {
		c := p[i:min(i+chunk, len(p))]
		if bytes.Equal(c, zero[:len(c)]) {
			continue
		}
		if _, err := f.WriteAt(c, off+int64(i)); err != nil {
			return fmt.Errorf("write disk: %w", err)
		}
	}
	return nil
}

// startWriteback starts writing n bytes of f at off to the device in the
// background and returns a function that waits until the kernel has queued
// them. The filesystem just written is only dirty page cache; without this
// the disk sees none of it until the final fsync, after the hashing that
// reads it back, so the two would run one after the other instead of side by
// side. A failure is not an error: the final fsync writes and reports.
func startWriteback(f *os.File, off, n int64) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
	}()
	return func() { <-done }
}
