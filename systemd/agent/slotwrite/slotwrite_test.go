package slotwrite

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

const chunkSize = 16 << 10

// fixedIndex cuts at fixed boundaries: which chunker cut an index does not
// matter to the writer (the factory's content-defined cut has its own tests).
func fixedIndex(b []byte) *slot.Index { return fixedIndexOf(b, chunkSize) }

func fixedIndexOf(b []byte, size int) *slot.Index {
	x := &slot.Index{Params: slot.Params{Polynomial: 1, MinSize: uint32(size), MaxSize: uint32(size), AverageBits: 1}, Size: int64(len(b))}
	for off := 0; off < len(b); off += size {
		c := b[off:min(off+size, len(b))]
		x.Chunks = append(x.Chunks, slot.Chunk{Digest: sha256.Sum256(c), Size: uint32(len(c))})
	}
	return x
}

func pack(x, base *slot.Index, img []byte) []byte {
	at := x.Locate()
	var p []byte
	for _, c := range slot.Lacking(x, base) {
		o := at[c.Digest].Offset
		p = append(p, img[o:o+int64(c.Size)]...)
	}
	return p
}

func random(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 0))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// release10 and release11 share most chunks; 1.1 has two new ones and
// repeats one of 1.0's in a new place.
func releases() (old, img []byte) {
	old = random(1, 64*chunkSize+100)
	img = bytes.Clone(old)
	copy(img[3*chunkSize:], random(2, chunkSize))
	copy(img[40*chunkSize:], random(3, chunkSize))
	copy(img[50*chunkSize:], old[7*chunkSize:8*chunkSize])
	return old, img
}

// target is a file standing in for the inactive slot, full of what a slot
// held before (not zeros: nothing may be taken for written).
func target(t *testing.T, size int) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "slot-b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(random(9, size)); err != nil {
		t.Fatal(err)
	}
	return f
}

func contents(t *testing.T, f *os.File, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestWrite(t *testing.T) {
	old, img := releases()
	x, base := fixedIndex(img), fixedIndex(old)
	p := pack(x, base, img)
	if len(p) != 2*chunkSize {
		t.Fatalf("pack of %d bytes, want the two new chunks", len(p))
	}
	for _, tc := range []struct {
		name string
		src  Source
		want Stats
	}{
		{"delta", Source{Index: x, Base: base, Active: bytes.NewReader(old), Pack: bytes.NewReader(p)},
			Stats{Seeded: int64(len(img)) - 2*chunkSize, Packed: 2 * chunkSize}},
		{"whole image, no active slot", Source{Index: x, Pack: bytes.NewReader(pack(x, nil, img))},
			Stats{Packed: int64(len(img))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := target(t, len(img)+chunkSize)
			var last int64
			st, err := Write(context.Background(), f, int64(len(img)+chunkSize), tc.src, WithJobs(3),
				WithProgress(func(done, total int64) { last = done }))
			if err != nil {
				t.Fatal(err)
			}
			if st != tc.want {
				t.Errorf("stats %+v, want %+v", st, tc.want)
			}
			if last != x.Size {
				t.Errorf("progress ended at %d of %d", last, x.Size)
			}
			if !bytes.Equal(contents(t, f, len(img)), img) {
				t.Fatal("the slot does not hold the new image")
			}
		})
	}
}

// A delta for nodes of two releases packs what either lacks; a node of
// each takes the chunks it lacks from the pack and the rest from its slot.
func TestWriteFromAPackForTwoBases(t *testing.T) {
	old, img := releases()
	other := bytes.Clone(old)
	copy(other[1*chunkSize:], random(4, chunkSize)) // its chunk 1 is not the new image's
	x, base, otherBase := fixedIndex(img), fixedIndex(old), fixedIndex(other)
	at := x.Locate()
	var p []byte
	for _, c := range slot.LackingAny(x, base, otherBase) {
		o := at[c.Digest].Offset
		p = append(p, img[o:o+int64(c.Size)]...)
	}
	if len(p) != 3*chunkSize {
		t.Fatalf("pack of %d bytes, want the two new chunks and the one the other base lacks", len(p))
	}
	for name, node := range map[string]struct {
		base   *slot.Index
		active []byte
		lacks  int64 // chunks it reads from the pack: the rest its slot has
	}{"1.0": {base, old, 2}, "other": {otherBase, other, 3}} {
		f := target(t, len(img))
		src := Source{Index: x, Base: node.base, Active: bytes.NewReader(node.active), Pack: bytes.NewReader(p), PackBases: []*slot.Index{base, otherBase}}
		st, err := Write(context.Background(), f, int64(len(img)), src)
		if err != nil {
			t.Fatalf("node of %s: %v", name, err)
		}
		if want := node.lacks * chunkSize; st.Packed != want {
			t.Errorf("node of %s read %d bytes of the pack, want %d", name, st.Packed, want)
		}
		if !bytes.Equal(contents(t, f, len(img)), img) {
			t.Errorf("node of %s: the slot does not hold the new image", name)
		}
	}
	// Without the pack's bases, a node of 1.0 reads the pack as cut
	// against its own base alone: the chunks it finds there are not the
	// ones it wants, and it refuses them.
	f := target(t, len(img))
	_, err := Write(context.Background(), f, int64(len(img)), Source{Index: x, Base: base, Active: bytes.NewReader(old), Pack: bytes.NewReader(p)})
	if !errors.Is(err, contract.ErrDamaged) {
		t.Errorf("the pack read as one base's: %v, want contract.ErrDamaged", err)
	}
}

func TestWriteRefuses(t *testing.T) {
	old, img := releases()
	x, base := fixedIndex(img), fixedIndex(old)
	p := pack(x, base, img)
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 0x10; return b }
	for _, tc := range []struct {
		name     string
		src      Source
		capacity int64
		want     string
		damaged  bool
	}{
		{"a flipped bit in the stick's pack", Source{Index: x, Base: base, Active: bytes.NewReader(old), Pack: bytes.NewReader(flip(p, chunkSize+7))},
			0, "of the stick's pack are not chunk 40", true},
		{"an active slot that is not its index", Source{Index: x, Base: base, Active: bytes.NewReader(flip(old, 20*chunkSize)), Pack: bytes.NewReader(p)},
			0, "of the active slot are not chunk 20", true},
		{"a short pack", Source{Index: x, Base: base, Active: bytes.NewReader(old), Pack: bytes.NewReader(p[:chunkSize])},
			0, "reading 16384 bytes at 16384 of the stick's pack", false},
		{"a slot too small", Source{Index: x, Base: base, Active: bytes.NewReader(old), Pack: bytes.NewReader(p)},
			int64(len(img) - 1), "must be at least 1048676 bytes", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := target(t, len(img))
			capacity := tc.capacity
			if capacity == 0 {
				capacity = int64(len(img))
			}
			_, err := Write(context.Background(), f, capacity, tc.src, WithJobs(1))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write: %v, want an error with %q", err, tc.want)
			}
			if errors.Is(err, contract.ErrDamaged) != tc.damaged {
				t.Errorf("errors.Is(contract.ErrDamaged) = %v for %v", !tc.damaged, err)
			}
		})
	}
}

// A write cut short (the stick pulled, the power cut) and started again with
// WithResume writes only what is not yet in place.
func TestResume(t *testing.T) {
	old, img := releases()
	x, base := fixedIndex(img), fixedIndex(old)
	p := pack(x, base, img)
	src := Source{Index: x, Base: base, Active: bytes.NewReader(old), Pack: bytes.NewReader(p)}
	f := target(t, len(img))

	ctx, cancel := context.WithCancel(context.Background())
	_, err := Write(ctx, f, int64(len(img)), src, WithJobs(1), WithProgress(func(done, _ int64) {
		if done >= x.Size/2 {
			cancel()
		}
	}))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted Write: %v", err)
	}
	st, err := Write(context.Background(), f, int64(len(img)), src, WithResume())
	if err != nil {
		t.Fatal(err)
	}
	if st.Kept < x.Size/2 || st.Kept+st.Seeded+st.Packed != x.Size {
		t.Errorf("resumed: %+v; want at least half of %d kept", st, x.Size)
	}
	if !bytes.Equal(contents(t, f, len(img)), img) {
		t.Fatal("the resumed slot does not hold the new image")
	}
}
