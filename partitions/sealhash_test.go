package partitions

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand"
	"testing"
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
			h := newSealHash(SealVersion)
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
			h = newSealHash(SealVersion)
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
			h = newSealHash(SealVersion)
			h.Write(stream)
			if h.digest() == want {
				t.Errorf("byte %d flipped: digest unchanged", i)
			}
		})
	}
}
