package recovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

func record(data []byte) Record {
	c := NewChunker()
	// Odd write sizes: chunk boundaries must not depend on them.
	for p := data; len(p) > 0; {
		n := min(len(p), 1<<20+3)
		c.Write(p[:n])
		p = p[n:]
	}
	var r Record
	c.Fill(&r)
	return r
}

// testData is data, zeros, data, a short chunk of zeros: data chunks are
// hashed, zero chunks compared with zeros.
func testData() []byte {
	data := make([]byte, 3*ChunkSize+100)
	copy(data, bytes.Repeat([]byte("reflash "), ChunkSize/8))
	copy(data[2*ChunkSize:], bytes.Repeat([]byte("chunk 3 "), ChunkSize/8))
	return data
}

// Verify hands fn every chunk in order and only chunks that match: a
// flipped byte in any chunk, a read that fails or ends early, or an fn that
// fails stops it before fn sees another chunk, and says which bytes.
func TestVerify(t *testing.T) {
	t.Parallel()
	data := testData()
	rec := record(data)
	if len(rec.Chunks) != 4 || rec.Size != int64(len(data)) {
		t.Fatalf("%d chunks for %d bytes", len(rec.Chunks), rec.Size)
	}
	flip := func(at int) io.ReaderAt {
		b := append([]byte(nil), data...)
		b[at] ^= 1
		return bytes.NewReader(b)
	}
	stop := errors.New("the writer failed")
	for _, tc := range []struct {
		name     string
		r        io.ReaderAt
		from, to int
		failAt   int // fn fails on this chunk; -1: never
		seen     []int
		want     string // "" no error
		damaged  bool
	}{
		{"every chunk", bytes.NewReader(data), 0, 4, -1, []int{0, 1, 2, 3}, "", false},
		{"a range", bytes.NewReader(data), 1, 3, -1, []int{1, 2}, "", false},
		{"an empty range", bytes.NewReader(data), 2, 2, -1, nil, "", false},
		{"flipped in the first chunk", flip(5), 0, 4, -1, nil, "bytes 0–4194304 (chunk 1 of 4) does not match the stick's record", true},
		{"flipped in zeros", flip(ChunkSize + 7), 0, 4, -1, []int{0}, "bytes 4194304–8388608 (chunk 2 of 4) does not match", true},
		{"flipped in a data chunk", flip(2*ChunkSize + 5), 0, 4, -1, []int{0, 1}, "(chunk 3 of 4) does not match", true},
		{"flipped in the short last chunk", flip(3*ChunkSize + 99), 0, 4, -1, []int{0, 1, 2}, "bytes 12582912–12583012 (chunk 4 of 4) does not match", true},
		{"flipped outside the range", flip(5), 1, 4, -1, []int{1, 2, 3}, "", false},
		{"the reader ends early", bytes.NewReader(data[:ChunkSize+10]), 0, 4, -1, []int{0}, "bytes 4194304–8388608: EOF", false},
		{"fn fails", bytes.NewReader(data), 0, 4, 2, []int{0, 1}, "the writer failed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var seen []int
			err := rec.Verify(context.Background(), tc.r, tc.from, tc.to, func(i int, b []byte) error {
				if i == tc.failAt {
					return stop
				}
				off := int64(i) * ChunkSize
				if !bytes.Equal(b, data[off:off+int64(len(b))]) {
					t.Errorf("chunk %d: fn was handed other bytes", i)
				}
				seen = append(seen, i)
				return nil
			})
			if !slices.Equal(seen, tc.seen) {
				t.Errorf("fn saw chunks %v, want %v", seen, tc.seen)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want %q", err, tc.want)
			case errors.Is(err, ErrDamaged) != tc.damaged:
				t.Fatalf("errors.Is(%v, ErrDamaged) = %v", err, !tc.damaged)
			}
		})
	}
}

// VerifyWith runs its own check instead of the record's, on every chunk,
// and stops where it fails as Verify does.
func TestVerifyWith(t *testing.T) {
	t.Parallel()
	data := testData()
	rec := record(data)
	other := bytes.Repeat([]byte{7}, len(data)) // matches no digest
	for _, tc := range []struct {
		name string
		bad  int // the chunk the check refuses; -1: none
		seen []int
	}{
		{"every chunk passes", -1, []int{0, 1, 2, 3}},
		{"the third fails", 2, []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var checked atomic.Int32
			var seen []int
			err := rec.VerifyWith(context.Background(), bytes.NewReader(other), 0, 4, func(i int, b []byte) error {
				checked.Add(1)
				if i == tc.bad {
					return rec.Damaged(i)
				}
				return nil
			}, func(i int, _ []byte) error { seen = append(seen, i); return nil })
			if !slices.Equal(seen, tc.seen) {
				t.Errorf("fn saw chunks %v, want %v", seen, tc.seen)
			}
			if tc.bad < 0 && (err != nil || checked.Load() != 4) {
				t.Fatalf("err %v, %d chunks checked, want nil and 4", err, checked.Load())
			}
			if tc.bad >= 0 && !errors.Is(err, ErrDamaged) {
				t.Fatalf("got %v, want the check's error", err)
			}
		})
	}
}

// A cancelled context stops Verify with ctx's error, not a silent success.
func TestVerifyStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	data := testData()
	rec := record(data)
	ctx, cancel := context.WithCancel(context.Background())
	err := rec.Verify(ctx, bytes.NewReader(data), 0, 4, func(i int, _ []byte) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestReadRefusesABadRecord(t *testing.T) {
	good := record([]byte("disk"))
	for _, tc := range []struct {
		name string
		edit func(r map[string]any)
		want string
	}{
		{"good", func(map[string]any) {}, ""},
		{"no size", func(r map[string]any) { r["size"] = 0 }, "want the disk image's size"},
		{"chunks missing", func(r map[string]any) { r["chunks"] = []string{} }, "0 chunk digests for 4 bytes: want 1"},
		{"bad digest", func(r map[string]any) { r["sha256"] = "md5:x" }, "want sha256:<64 hex digits>"},
		{"unknown field", func(r map[string]any) { r["target"] = map[string]any{"pth": "/dev/sda"} }, `unknown field "pth"`},
		{"bounds", func(r map[string]any) { r["target"] = map[string]any{"minSize": 10, "maxSize": 5} }, "make no sense"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := json.Marshal(good)
			var m map[string]any
			json.Unmarshal(b, &m)
			tc.edit(m)
			b, _ = json.Marshal(m)
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, RecordFile), b, 0o644)
			_, err := Read(dir)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
