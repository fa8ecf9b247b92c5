package bundlefmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Magic starts every bundle.
const Magic = "KILNBNDL"

// FormatVersion is the version of the header layout.
const FormatVersion = 1

const (
	headerFixed = 24       // magic, version, header size, envelope length
	align       = 4096     // the filesystem starts on a 4 KiB boundary
	maxEnvelope = 64 << 20 // a manifest of 100,000 blobs is ~25 MB: anything larger is not ours
)

// MaxSlack is the most zero padding a header may have beyond what its
// envelope needs.
const MaxSlack = 16 * align

// ErrNotBundle means the bytes do not start with a bundle header.
var ErrNotBundle = errors.New("not a kiln bundle (no " + Magic + " header)")

// Header is the start of a bundle: the signed envelope, and where the
// filesystem starts.
type Header struct {
	Envelope []byte // the DSSE envelope, as stored (canonical JSON)
	Size     int64  // header bytes, zero padded; the filesystem starts here
}

// HeaderSize is the smallest header holding an envelope of n bytes. A writer
// may reserve up to MaxSlack more (it sizes the header before the final
// envelope, which can come out shorter); no more is valid.
func HeaderSize(n int) int64 { return (int64(headerFixed+n) + align - 1) / align * align }

// EncodeHeader returns the header bytes for envelope, padded with zeros to
// size (from HeaderSize(len(envelope)) to MaxSlack more, in 4 KiB pages).
func EncodeHeader(envelope []byte, size int64) ([]byte, error) {
	if min := HeaderSize(len(envelope)); size < min || size > min+MaxSlack || size%align != 0 {
		return nil, fmt.Errorf("bundle header of %d bytes cannot hold a %d-byte envelope (want %d)", size, len(envelope), min)
	}
	b := make([]byte, size)
	copy(b, Magic)
	binary.LittleEndian.PutUint32(b[8:], FormatVersion)
	binary.LittleEndian.PutUint32(b[12:], uint32(size))
	binary.LittleEndian.PutUint64(b[16:], uint64(len(envelope)))
	copy(b[headerFixed:], envelope)
	return b, nil
}

// ReadHeader reads the header at the start of r: only the header's own
// bytes. The padding after the envelope must be zero, so that every byte of
// a bundle is either signed or fixed.
func ReadHeader(r io.ReaderAt) (*Header, error) {
	fixed := make([]byte, headerFixed)
	if _, err := r.ReadAt(fixed, 0); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, ErrNotBundle
		}
		return nil, fmt.Errorf("read bundle header: %w", err)
	}
	if string(fixed[:8]) != Magic {
		return nil, ErrNotBundle
	}
	if v := binary.LittleEndian.Uint32(fixed[8:]); v != FormatVersion {
		return nil, fmt.Errorf("bundle header: format version %d, this kiln reads %d (use a newer kiln)", v, FormatVersion)
	}
	size := int64(binary.LittleEndian.Uint32(fixed[12:]))
	n := binary.LittleEndian.Uint64(fixed[16:])
	if n == 0 || n > maxEnvelope || size < HeaderSize(int(n)) || size > HeaderSize(int(n))+MaxSlack || size%align != 0 {
		return nil, fmt.Errorf("bundle header: damaged (envelope length %d, header size %d)", n, size)
	}
	b := make([]byte, size)
	if _, err := r.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("read bundle header (%d bytes): %w", size, err)
	}
	if want, _ := EncodeHeader(b[headerFixed:headerFixed+n], size); !bytes.Equal(b, want) {
		return nil, fmt.Errorf("bundle header: damaged (bytes after the envelope are not zero)")
	}
	return &Header{Envelope: b[headerFixed : headerFixed+n], Size: size}, nil
}
