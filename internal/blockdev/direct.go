package blockdev

import (
	"fmt"
	"io"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Direct reads a block device with O_DIRECT: every read comes from the
// device, never from the kernel's cache of it (before a direct read the
// kernel writes out any dirty cached pages of the range, so the device
// answers with what it was given). That is what a read-back must read;
// dropping the cache instead (BLKFLSBUF, POSIX_FADV_DONTNEED) drops it for
// the whole device, or silently keeps pages in use. It is safe for
// concurrent ReadAt.
type Direct struct {
	f     *os.File
	block int // logical block size: direct reads start and end on it
}

// directAlign is the alignment of the memory a direct read fills: the page
// size, which every device's DMA alignment divides.
const directAlign = 4096

// OpenDirect opens the block device at path for direct reads.
func OpenDirect(path string) (*Direct, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for direct reads: %w", path, err)
	}
	block, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET)
	if err != nil || block <= 0 || directAlign%block != 0 {
		f.Close()
		return nil, fmt.Errorf("%s: logical block size %d (%v): not a block device kiln can read back", path, block, err)
	}
	return &Direct{f: f, block: block}, nil
}

// ReadAt reads len(b) bytes at off, which must be a multiple of the
// logical block size. b may have any length and alignment: a buffer a
// direct read cannot fill in place (unaligned, or ending inside a block) is
// read through an aligned one and copied.
func (d *Direct) ReadAt(b []byte, off int64) (int, error) {
	if off%int64(d.block) != 0 {
		return 0, fmt.Errorf("read %s at %d: not on a %d-byte block", d.f.Name(), off, d.block)
	}
	if len(b) == 0 || (len(b)%d.block == 0 && uintptr(unsafe.Pointer(&b[0]))%directAlign == 0) {
		return d.f.ReadAt(b, off)
	}
	buf := bounceBuffers.Get().([]byte)
	defer bounceBuffers.Put(buf)
	n := 0
	for n < len(b) {
		want := min(len(b)-n, len(buf))
		whole := (want + d.block - 1) / d.block * d.block // within the device: its size is whole blocks
		k, err := d.f.ReadAt(buf[:whole], off+int64(n))
		n += copy(b[n:], buf[:min(k, want)])
		if k < want {
			if err == nil {
				err = io.EOF
			}
			return n, err
		}
	}
	return n, nil
}

var bounceBuffers = sync.Pool{New: func() any { return alignedBuffer(Chunk) }}

// Close closes the device.
func (d *Direct) Close() error { return d.f.Close() }

// alignedBuffer is n bytes starting on a directAlign boundary.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))%directAlign)) % directAlign
	return b[skip : skip+n : skip+n]
}

// Sync makes what was written to the device through f durable: on a block
// device fsync and fdatasync write out the dirty pages and then send the
// device a cache flush (the kernel's blkdev_fsync), so the bytes are on the
// medium, not in a volatile write cache. sync_file_range, which could write
// out one range only, sends no cache flush.
func Sync(f *os.File) error {
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("flush %s: %w", f.Name(), err)
	}
	return nil
}
