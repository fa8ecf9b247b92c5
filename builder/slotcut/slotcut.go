// Package slotcut cuts a slot image into content-defined chunks (an
// slot.Index) and writes the pack of the chunks a delta carries.
//
// Boundaries come from a Rabin fingerprint over a sliding window
// (github.com/restic/chunker, as restic and casync cut): an insertion moves
// only the boundaries near it, so an OS that gained one package shares every
// chunk but those around the change with the release before it, wherever the
// filesystem put the new bytes.
package slotcut

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"

	"github.com/restic/chunker"

	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

// Default is how kiln cuts: 16 KiB chunks on average, between 4 and 64 KiB.
// On a Debian /usr as squashfs (zstd, no fragments) that gained three
// packages, the pack was 0.77 of the bytes they install; 64 KiB chunks gave
// 1.41, 1 MiB 11.4 (docs/BENCHMARKS.md). The index costs 36 bytes a chunk,
// 2.3 MiB for a 1 GiB slot. The polynomial is fixed so that every build cuts
// the same bytes the same way.
var Default = slot.Params{
	Polynomial:  0x3DA3358B4DC173,
	MinSize:     4 << 10,
	MaxSize:     64 << 10,
	AverageBits: 14,
}

// Cut reads the image to its end and describes it with Default's chunks.
func Cut(r io.Reader) (*slot.Index, error) { return CutWith(r, Default) }

// CutWith cuts with other parameters (benchmarks compare them).
func CutWith(r io.Reader, p slot.Params) (*slot.Index, error) {
	pol := chunker.Pol(p.Polynomial)
	if !pol.Irreducible() {
		return nil, fmt.Errorf("slot chunker: polynomial %#x is not irreducible", p.Polynomial)
	}
	c := chunker.NewWithBoundaries(r, pol, uint(p.MinSize), uint(p.MaxSize))
	c.SetAverageBits(int(p.AverageBits))
	x := &slot.Index{Params: p}
	buf := make([]byte, p.MaxSize)
	for {
		ch, err := c.Next(buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		x.Chunks = append(x.Chunks, slot.Chunk{Digest: sha256.Sum256(ch.Data), Size: uint32(ch.Length)})
		x.Size += int64(ch.Length)
	}
	if err := x.Check(); err != nil {
		return nil, err
	}
	return x, nil
}

// WritePack writes the chunks of image (which x describes) that the delta
// from bases carries (every chunk one of them lacks; nil lacks all), in
// slot.LackingAny's order, checking each against x as it reads it: a pack
// never holds bytes its index does not name. It returns the bytes written.
func WritePack(w io.Writer, image io.ReaderAt, x *slot.Index, bases ...*slot.Index) (int64, error) {
	at := x.Locate()
	var n int64
	buf := make([]byte, x.Params.MaxSize)
	for _, c := range slot.LackingAny(x, bases...) {
		b := buf[:c.Size]
		off := at[c.Digest].Offset
		if _, err := image.ReadAt(b, off); err != nil {
			return n, fmt.Errorf("slot image at %d: %w", off, err)
		}
		if sha256.Sum256(b) != c.Digest {
			return n, fmt.Errorf("slot image changed while the pack was written: %d bytes at %d no longer match its index", c.Size, off)
		}
		m, err := w.Write(b)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
