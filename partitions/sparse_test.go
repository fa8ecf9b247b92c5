package partitions

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A sparse file reads back byte for byte through holeReader, and its holes
// are answered without reading them.
func TestHoleReader(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sparse.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20)
	rand.Read(data)
	// data at 0, 8 MiB and at the very end; holes between.
	for _, at := range []int64{0, 8 << 20, 29 << 20} {
		if _, err := f.WriteAt(data[:1<<20+123], at); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	f, err = os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := newHoleReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := io.CopyBuffer(&got, struct{ io.Reader }{h}, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("holeReader gave %d bytes that differ from the file's %d", got.Len(), len(want))
	}
	if h.holeRead < 20<<20 {
		t.Errorf("only %d bytes answered as holes; the file has over 20 MiB of them", h.holeRead)
	}
}
