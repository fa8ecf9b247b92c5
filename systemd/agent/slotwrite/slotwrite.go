// Package slotwrite writes a new slot image into the node's inactive slot
// from a delta: a chunk the active slot already holds is copied from it, every
// other comes from the stick's pack (slot.LackingAny's order over the
// releases the delta was made for), and each is checked
// against the new, signed index before a byte of it is written. The inactive
// slot may be left half-written by a power cut or a pulled stick; it is never
// made bootable here (the caller checks the whole slot's verity root hash and
// only then writes the boot entry), and a second Write with WithResume keeps
// what is already in place.
package slotwrite

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

// Target is the inactive slot (a block device or, in tests, a file).
type Target interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
}

// Source is what a slot image is written from.
type Source struct {
	Index  *slot.Index // the new image, from the signed manifest
	Base   *slot.Index // what Active holds; nil when the node has no slot to seed from
	Active io.ReaderAt // the node's active slot (read-only, dm-verity)
	Pack   io.ReaderAt // the stick's chunks of the delta from Base to Index
	// PackBases are the indexes the pack was cut against (slot.LackingAny:
	// a delta for several releases packs what any of them lacks; a nil one
	// lacks everything), Base among them; none: Base alone.
	PackBases []*slot.Index
}

// Stats says where the bytes came from.
type Stats struct {
	Seeded int64 // copied from the active slot
	Packed int64 // read from the stick
	Kept   int64 // already in place (WithResume)
}

// Option changes how Write works.
type Option func(*writer)

// WithProgress reports the bytes done after each chunk (from several
// goroutines, never concurrently).
func WithProgress(fn func(done, total int64)) Option { return func(w *writer) { w.progress = fn } }

// WithResume reads each chunk's place in the target first and keeps it when
// it already holds the chunk: a re-plugged stick writes only what the last
// attempt did not. It costs a read of the target.
func WithResume() Option { return func(w *writer) { w.resume = true } }

// WithJobs sets how many chunks are read, checked and written at once
// (default: one per CPU).
func WithJobs(n int) Option { return func(w *writer) { w.jobs = max(1, n) } }

type writer struct {
	progress func(done, total int64)
	resume   bool
	jobs     int

	src    Source
	dst    Target
	seed   map[[sha256.Size]byte]slot.Located
	packed map[[sha256.Size]byte]slot.Located

	mu    sync.Mutex
	done  int64
	stats Stats
}

// Write writes src.Index's image at the start of dst, which holds capacity
// bytes, and syncs it. It returns where the bytes came from.
func Write(ctx context.Context, dst Target, capacity int64, src Source, opts ...Option) (Stats, error) {
	w := &writer{jobs: runtime.NumCPU(), src: src, dst: dst}
	for _, o := range opts {
		o(w)
	}
	x := src.Index
	if x == nil {
		return Stats{}, errors.New("slot write: no index")
	}
	if err := x.Check(); err != nil {
		return Stats{}, err
	}
	if x.Size > capacity {
		return Stats{}, fmt.Errorf("the new slot image is %d bytes; the inactive slot holds %d: it must be at least %d bytes (rebuild the release with a smaller image or reflash with larger slots)", x.Size, capacity, x.Size)
	}
	if src.Base != nil && src.Active != nil {
		w.seed = src.Base.Locate()
	}
	w.packed = make(map[[sha256.Size]byte]slot.Located)
	packBases := src.PackBases
	if packBases == nil {
		packBases = []*slot.Index{w.seedIndex()}
	}
	for _, c := range slot.LackingAny(x, packBases...) {
		w.packed[c.Digest] = c
	}

	offsets := make([]int64, len(x.Chunks))
	var off int64
	for i, c := range x.Chunks {
		offsets[i] = off
		off += int64(c.Size)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for range w.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 2*x.Params.MaxSize)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(x.Chunks) || ctx.Err() != nil {
					return
				}
				if err := w.chunk(i, offsets[i], buf); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return w.stats, firstErr
	}
	if err := ctx.Err(); err != nil {
		return w.stats, err
	}
	if err := dst.Sync(); err != nil {
		return w.stats, fmt.Errorf("slot write: sync: %w", err)
	}
	return w.stats, nil
}

// seedIndex is the index the pack was cut against: the base, when there is
// an active slot to read it from.
func (w *writer) seedIndex() *slot.Index {
	if w.seed == nil {
		return nil
	}
	return w.src.Base
}

// chunk puts chunk i at off: kept, seeded or packed, checked in every case.
func (w *writer) chunk(i int, off int64, buf []byte) error {
	c := w.src.Index.Chunks[i]
	if w.resume {
		b := buf[c.Size : 2*c.Size]
		if _, err := w.dst.ReadAt(b, off); err == nil && sha256.Sum256(b) == c.Digest {
			w.count(c.Size, &w.stats.Kept)
			return nil
		}
	}
	b := buf[:c.Size]
	// The active slot first: a pack for several releases holds chunks
	// this node has, and its own disk is faster than the stick.
	from, where, counter := w.src.Active, "the active slot", &w.stats.Seeded
	at, ok := w.seed[c.Digest]
	if !ok {
		at, ok = w.packed[c.Digest]
		from, where, counter = w.src.Pack, "the stick's pack", &w.stats.Packed
	}
	if !ok || from == nil {
		// Lacking puts every digest the seed lacks in the pack.
		return fmt.Errorf("slot write: chunk %d has no source", i)
	}
	if _, err := from.ReadAt(b, at.Offset); err != nil {
		return fmt.Errorf("slot write: reading %d bytes at %d of %s: %w", c.Size, at.Offset, where, err)
	}
	if sha256.Sum256(b) != c.Digest {
		return fmt.Errorf("slot write: %w: %d bytes at %d of %s are not chunk %d of the signed index; nothing bootable was changed",
			contract.ErrDamaged, c.Size, at.Offset, where, i)
	}
	if _, err := w.dst.WriteAt(b, off); err != nil {
		return fmt.Errorf("slot write: writing %d bytes at %d of the inactive slot: %w", c.Size, off, err)
	}
	w.count(c.Size, counter)
	return nil
}

func (w *writer) count(n uint32, counter *int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*counter += int64(n)
	w.done += int64(n)
	if w.progress != nil {
		w.progress(w.done, w.src.Index.Size)
	}
}
