package seal

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hashHoles hashes a sparse file's ranges exactly as a plain read does,
// wherever the range starts and ends (in data, in a hole, at the end), and
// refuses a range past the end.
func TestHashHoles(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sparse.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 1<<20+123)
	rand.Read(data)
	for _, at := range []int64{0, 8 << 20, 29 << 20} { // data, holes between, data at the end
		if _, err := f.WriteAt(data, at); err != nil {
			t.Fatal(err)
		}
	}
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(whole))
	for _, tc := range []struct {
		name      string
		off, size int64
	}{
		{"whole file", 0, size},
		{"data into hole", 1 << 20, 2 << 20},
		{"hole into data", 4 << 20, 5 << 20},
		{"hole only", 2 << 20, 3 << 20},
		{"data only", 8<<20 + 7, 1000},
		{"hole to the end", 10 << 20, size - 10<<20},
		{"empty", 5 << 20, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := sha256.New()
			if err := hashHoles(context.Background(), h, f, span{tc.off, tc.size}, make([]byte, 64<<10)); err != nil {
				t.Fatal(err)
			}
			want := sha256.Sum256(whole[tc.off : tc.off+tc.size])
			if !bytes.Equal(h.Sum(nil), want[:]) {
				t.Errorf("digest of bytes %d+%d differs from a plain read's", tc.off, tc.size)
			}
		})
	}
	if err := hashHoles(context.Background(), sha256.New(), f, span{size - 10, 11}, make([]byte, 64<<10)); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("a range one byte past the end: got %v, want a truncation error", err)
	}
}
