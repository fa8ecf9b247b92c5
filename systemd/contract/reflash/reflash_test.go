package reflash

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
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

// Data chunks are hashed, zero chunks compared with zeros: a flipped byte
// is found in either, and named by its chunk.
func TestCheck(t *testing.T) {
	data := make([]byte, 3*ChunkSize+100) // data, zeros, data, a short chunk of zeros
	copy(data, bytes.Repeat([]byte("reflash "), ChunkSize/8))
	copy(data[2*ChunkSize:], bytes.Repeat([]byte("chunk 3 "), ChunkSize/8))
	rec := record(data)
	if len(rec.Chunks) != 4 || rec.Size != int64(len(data)) {
		t.Fatalf("%d chunks for %d bytes", len(rec.Chunks), rec.Size)
	}
	if err := rec.Check(context.Background(), bytes.NewReader(data), io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at   int
		want string
	}{
		{5, "bytes 0–4194304 (chunk 1 of 4) does not match the stick's record"},
		{ChunkSize + 7, "(chunk 2 of 4) does not match"},
		{2*ChunkSize + 5, "(chunk 3 of 4) does not match"},
		{3*ChunkSize + 99, "bytes 12582912–12583012 (chunk 4 of 4) does not match"},
	} {
		flipped := append([]byte(nil), data...)
		flipped[tc.at] ^= 1
		err := rec.Check(context.Background(), bytes.NewReader(flipped), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrDamaged) {
			t.Errorf("byte %d flipped: %v, want %q", tc.at, err, tc.want)
		}
	}
	err := rec.Check(context.Background(), bytes.NewReader(data[:ChunkSize]), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("short: %v", err)
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
