package blockdev

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/progress"
)

// Chunk is the unit of every copy: large enough for full-speed sequential
// I/O, small enough to keep memory flat.
const Chunk = 4 << 20

// Flush makes what was written to the device durable and drops the kernel's
// cache of it, so the next read comes from the device and not from memory.
func Flush(f *os.File) error {
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", f.Name(), err)
	}
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("drop the cache of %s: %w", f.Name(), err)
	}
	return nil
}

// ReadBack reads the first size bytes of the device and compares their
// sha256 with want.
func ReadBack(ctx context.Context, dev string, size int64, want []byte, p progress.Reporter) error {
	rd, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("read back %s: %w", dev, err)
	}
	defer rd.Close()
	got := sha256.New()
	t := p.Task("read back "+dev, size)
	n, err := Copy(ctx, io.MultiWriter(got, t), io.LimitReader(rd, size))
	if err == nil && n < size {
		err = fmt.Errorf("the device ended after %d bytes", n)
	}
	t.Done(err)
	if err != nil {
		return fmt.Errorf("read back %s: %w: the stick is unreliable; use another stick", dev, err)
	}
	if g := got.Sum(nil); !bytes.Equal(want, g) {
		return fmt.Errorf("read back %s: its first %d bytes have sha256 %x, the image %x: the stick did not keep what was written; use another stick",
			dev, size, g, want)
	}
	return nil
}

// Copy is io.Copy in chunks, stopping when ctx is done.
func Copy(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, Chunk)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		r, err := io.ReadFull(src, buf)
		if r > 0 {
			if _, werr := dst.Write(buf[:r]); werr != nil {
				return n, werr
			}
			n += int64(r)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
