package base

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// holeReader reads a raw (sparse) file sequentially, but answers the file's
// holes with zeros it makes itself instead of asking the kernel to read them:
// a base disk is mostly holes, and reading a hole still costs a zero-filled
// page-cache page per 4 KiB. Data regions are read as usual. If the
// filesystem cannot tell holes (SEEK_DATA unsupported), every byte is read.
type holeReader struct {
	f       *os.File
	off     int64
	size    int64
	dataEnd int64 // when off < dataEnd, [off, dataEnd) is data: read it
	noSeek  bool  // SEEK_DATA/SEEK_HOLE unsupported: plain reads
}

func newHoleReader(f *os.File) (*holeReader, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return &holeReader{f: f, size: fi.Size()}, nil
}

func (h *holeReader) Read(p []byte) (int, error) {
	if h.off >= h.size {
		return 0, io.EOF
	}
	if h.noSeek || h.off < h.dataEnd {
		return h.read(p)
	}
	data, err := unix.Seek(int(h.f.Fd()), h.off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO): // no data after off: the rest is a hole
		data = h.size
	case err != nil: // e.g. EINVAL: no hole support here
		h.noSeek = true
		if _, err := h.f.Seek(h.off, io.SeekStart); err != nil {
			return 0, err
		}
		return h.read(p)
	}
	if data > h.off { // a hole: answer zeros, up to where data starts
		n := int(min(int64(len(p)), data-h.off))
		clear(p[:n])
		h.off += int64(n)
		return n, nil
	}
	hole, err := unix.Seek(int(h.f.Fd()), h.off, unix.SEEK_HOLE)
	if err != nil {
		return 0, err
	}
	h.dataEnd = hole
	if _, err := h.f.Seek(h.off, io.SeekStart); err != nil {
		return 0, err
	}
	return h.read(p)
}

// read reads data at off (the file position is kept at off).
func (h *holeReader) read(p []byte) (int, error) {
	if !h.noSeek {
		p = p[:min(int64(len(p)), h.dataEnd-h.off)]
	}
	n, err := h.f.Read(p)
	h.off += int64(n)
	return n, err
}
