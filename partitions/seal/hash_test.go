package seal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
)

// referenceChunked is version 2's definition written out plainly.
func referenceChunked(data []byte) string {
	outer := sha256.New()
	for off := 0; off < len(data); off += sealChunk {
		sum := sha256.Sum256(data[off:min(off+sealChunk, len(data))])
		outer.Write(sum[:])
	}
	return "sha256:" + hex.EncodeToString(outer.Sum(nil))
}

// TestChunkedHash: however the bytes arrive — in writes of any size, zeros
// as a count or as bytes, on a chunk boundary or not — the digest is the
// definition's; and it differs from version 1's and with any byte changed.
func TestChunkedHash(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(1))
	// Pieces of a stream: data of some length, or zeros.
	type piece struct {
		n    int
		zero bool
	}
	cases := map[string][]piece{
		"empty":                  nil,
		"one byte":               {{1, false}},
		"one chunk of data":      {{sealChunk, false}},
		"zeros, aligned":         {{3 * sealChunk, true}},
		"zeros, unaligned":       {{100, false}, {3*sealChunk + 7, true}, {5, false}},
		"zeros ending a chunk":   {{sealChunk - 10, false}, {10, true}, {sealChunk, false}},
		"data between zero runs": {{2*sealChunk + 1, true}, {4096, false}, {sealChunk - 4096 - 1, true}, {sealChunk, true}},
		"short zero runs":        {{10, true}, {20, true}, {sealChunk, true}, {1, false}},
	}
	for name, pieces := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var stream []byte
			for _, p := range pieces {
				b := make([]byte, p.n)
				if !p.zero {
					rng.Read(b)
				}
				stream = append(stream, b...)
			}
			want := referenceChunked(stream)
			// Zeros as counts, data in odd-sized writes.
			h := newSealHash(Version)
			off := 0
			for _, p := range pieces {
				if p.zero {
					h.WriteZeros(int64(p.n))
				} else {
					for end := off + p.n; off < end; {
						k := min(end-off, 1+rng.Intn(300_000))
						h.Write(stream[off : off+k])
						off += k
					}
				}
				off += map[bool]int{true: p.n}[p.zero]
			}
			if got := h.digest(); got != want {
				t.Errorf("zeros as counts: %s, want %s", got, want)
			}
			// Every byte written, in one write.
			h = newSealHash(Version)
			h.Write(stream)
			if got := h.digest(); got != want {
				t.Errorf("one write: %s, want %s", got, want)
			}
			if len(stream) == 0 {
				return
			}
			v1 := newSealHash(1)
			v1.Write(stream)
			if sum := sha256.Sum256(stream); v1.digest() != "sha256:"+hex.EncodeToString(sum[:]) {
				t.Error("version 1 is not the sha256 of the bytes")
			}
			if v1.digest() == want && len(stream) > 0 {
				t.Error("version 1 and 2 agree: the chunking changes nothing")
			}
			i := rng.Intn(len(stream))
			stream[i] ^= 1
			if referenceChunked(stream) == want {
				t.Fatal("the reference misses a flipped byte")
			}
			h = newSealHash(Version)
			h.Write(stream)
			if h.digest() == want {
				t.Errorf("byte %d flipped: digest unchanged", i)
			}
		})
	}
}

// TestDigestRangeOnEveryCPU: a span hashed in runs on every CPU has the
// digest of the same span hashed in one go, holes or not, whatever its
// size and offset.
func TestDigestRangeOnEveryCPU(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(2))
	f, err := os.Create(filepath.Join(t.TempDir(), "disk"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 3*parallelSpan + 12345
	if err := f.Truncate(size); err != nil { // holes, with data here and there
		t.Fatal(err)
	}
	for _, at := range []int64{0, sealChunk - 7, parallelSpan + 3, 2*parallelSpan - 100, size - 5000} {
		b := make([]byte, 5000)
		rng.Read(b)
		if _, err := f.WriteAt(b, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, sp := range []span{
		{0, size}, {1, size - 1}, {sealChunk + 9, 2*parallelSpan + 1}, {0, parallelSpan}, {17, parallelSpan - 1},
	} {
		one := newSealHash(Version)
		if err := hashSpan(context.Background(), one, f, sp, make([]byte, mib)); err != nil {
			t.Fatal(err)
		}
		want := one.digest()
		got, err := digests{version: Version, r: f}.span(context.Background(), sp.off, sp.size)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("bytes %d+%d: on every CPU %s, in one go %s", sp.off, sp.size, got, want)
		}
		// And through a plain reader (no holes to seek), the same again.
		got, err = digests{version: Version, r: io.NewSectionReader(struct{ io.ReaderAt }{f}, 0, size)}.span(context.Background(), sp.off, sp.size)
		if err != nil || got != want {
			t.Errorf("bytes %d+%d read plainly: %s, %v; want %s", sp.off, sp.size, got, err, want)
		}
	}
}

// TestDigestStopsWhenCancelled (issue 26, item 7): the digests of kiln
// verify read a whole disk, for minutes on a large one; once the CLI's
// context is done (Ctrl-C, SIGTERM) they stop at the next read instead of
// hashing to the end.
func TestDigestStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, version := range []int{1, Version} {
		r := &fixtures.CountingReaderAt{R: bytes.NewReader(make([]byte, 128*mib))}
		if _, err := (digests{version: version, r: r}).span(ctx, 0, 128*mib); !errors.Is(err, context.Canceled) || r.N.Load() > 0 {
			t.Errorf("seal version %d digest, cancelled: %v after reading %d bytes; want context.Canceled, nothing read", version, err, r.N.Load())
		}
	}
}
