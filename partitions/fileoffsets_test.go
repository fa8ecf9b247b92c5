package partitions

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileOffsets: every file's contents, read from the filesystem the real
// mksquashfs wrote at the offset FileOffsets gives, are the file's bytes —
// names that sort differently bytewise and by path ("a.b" before "a/",
// upper case first), empty files, and a whole 1 MiB block of zeros, which
// mksquashfs would store as a hole without -no-sparse.
func TestFileOffsets(t *testing.T) {
	t.Parallel()
	tree := t.TempDir()
	random := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		return b
	}
	files := map[string][]byte{
		"a/x":                  random(5000),
		"a.b":                  random(10),
		"a/sub/deep":           random(3<<20 + 17),
		"B":                    random(1 << 20),
		"zeros":                append(make([]byte, 2<<20), random(100)...),
		"empty":                nil,
		"oci/blobs/sha256":     random(1),
		"oci/blobs/sha256.d/q": random(4097),
	}
	for p, data := range files {
		full := filepath.Join(tree, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disk := filepath.Join(t.TempDir(), "fs")
	const start = 8192
	for _, compression := range []string{"", "gzip"} {
		if _, err := WriteFilesystem(context.Background(), FilesystemOptions{Tree: tree, Disk: disk, Offset: start, Compression: compression, SourceDateEpoch: 1}); err != nil {
			t.Fatal(err)
		}
		offsets, err := FileOffsets(tree, disk, start)
		if compression != "" {
			if err == nil || !strings.Contains(err.Error(), "squashfs layout") {
				t.Errorf("compressed: %v, want the layout refused", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		img, err := os.ReadFile(disk)
		if err != nil {
			t.Fatal(err)
		}
		for p, data := range files {
			off, ok := offsets[p]
			if !ok {
				t.Errorf("%s: no offset", p)
				continue
			}
			if got := img[start+off : start+off+int64(len(data))]; !bytes.Equal(got, data) {
				t.Errorf("%s: the %d bytes at %d are not its contents", p, len(data), off)
			}
		}
		if len(offsets) != len(files) {
			t.Errorf("%d offsets for %d files", len(offsets), len(files))
		}
	}
}
