package squashfs

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
)

// BenchmarkSquashfs measures the image partition's writer (Write,
// uncompressed as by default: kiln's sqfswrite) writing a tree like an image
// partition (8 random 32 MiB blobs) at an offset of a file. The file is
// removed before each write: the writer refuses to write over bytes already
// there.
func BenchmarkSquashfs(b *testing.B) {
	tree := b.TempDir()
	buf := make([]byte, 32<<20)
	var total int64
	for i := 0; i < 8; i++ {
		if _, err := rand.Read(buf); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tree, fmt.Sprint(i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(len(buf))
	}
	disk := filepath.Join(b.TempDir(), "disk")
	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := os.Remove(disk); err != nil && !os.IsNotExist(err) {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := Write(context.Background(), Options{Tree: tree, Disk: disk, Offset: 450 << 20, SourceDateEpoch: fixtures.Epoch}); err != nil {
			b.Fatal(err)
		}
	}
}
