package bundle

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
)

// The chunk hasher, running while the real mksquashfs writes a filesystem
// of many chunks, gives the digests of the bytes as finally written.
func TestChunkHasherFollowsMksquashfs(t *testing.T) {
	dir, err := os.MkdirTemp("/var/tmp", "kiln-chunks-") // a real disk, as in production
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "oci", "blobs"), 0o755)
	rng := rand.NewChaCha8([32]byte{1})
	for i := range 24 {
		f, err := os.Create(filepath.Join(tree, "oci", "blobs", string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(f, rng, 4<<20+int64(i)*4099); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, comp := range []string{"none", "zstd"} {
		t.Run(comp, func(t *testing.T) { checkChunkHasher(t, dir, tree, comp) })
	}
}

func checkChunkHasher(t *testing.T, dir, tree, compression string) {
	out, err := os.Create(filepath.Join(dir, "fs-"+compression+".img"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	const start, chunk = 3 << 20, 1 << 20
	h := startChunkHasher(out, start, chunk, 1<<20, io.Discard)
	size, err := partitions.WriteFilesystem(context.Background(), partitions.FilesystemOptions{Tree: tree, Disk: out.Name(), Offset: start, Compression: compression, SourceDateEpoch: 1})
	if err != nil {
		h.finish(0)
		t.Fatal(err)
	}
	got, err := h.finish(size)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for off := int64(0); off < size; off += chunk {
		sum, err := bundle.HashRange(out, start+off, min(chunk, size-off), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, sum)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("chunk digests differ from the bytes written (%d vs %d chunks)", len(got), len(want))
	}
	if h.early == 0 {
		t.Errorf("no chunk was hashed while mksquashfs wrote %d chunks", len(want))
	}
	t.Logf("%d chunks, %d hashed while mksquashfs ran", len(want), h.early)
}
