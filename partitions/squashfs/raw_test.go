package squashfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
)

func TestMain(m *testing.M) { fixtures.Main(m) }

const MiB = fixtures.MiB

// The raw reader reads every regular file mksquashfs packed (one and many
// blocks, empty, sparse, in a directory of 1,500 entries whose listing and
// inodes span many metadata blocks) exactly as staged, and refuses what it
// cannot read rather than guess.
func TestRawSquashfsReadsWhatMksquashfsWrote(t *testing.T) {
	tree := fixtures.StageTree(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	many := filepath.Join(tree, "many")
	must(os.Mkdir(many, 0o755))
	for i := 0; i < 1500; i++ {
		must(os.WriteFile(filepath.Join(many, fmt.Sprintf("file-with-a-long-name-%04d", i)), []byte(fmt.Sprint(i)), 0o644))
	}
	sparse := append(make([]byte, 2*MiB), []byte("after two zero blocks")...)
	sparse = append(sparse, make([]byte, MiB)...) // ends in a zero block
	must(os.WriteFile(filepath.Join(tree, "sparse"), sparse, 0o644))
	must(os.WriteFile(filepath.Join(tree, "empty"), nil, 0o644))
	exact := bytes.Repeat([]byte("k"), 2*MiB) // a whole number of blocks
	must(os.WriteFile(filepath.Join(tree, "exact"), exact, 0o644))

	disk := filepath.Join(t.TempDir(), "fs.img")
	const offset = 3 * MiB
	must(os.WriteFile(disk, nil, 0o644))
	if _, err := Write(context.Background(), Options{Tree: tree, Disk: disk, Offset: offset, SourceDateEpoch: fixtures.Epoch}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(disk)
	must(err)
	defer f.Close()
	raw, err := OpenRaw(at(f, offset))
	must(err)

	files, err := readsTree(raw, tree)
	must(err)
	if files < 1550 {
		t.Fatalf("compared %d files", files)
	}
	for _, name := range []string{"missing", "many/missing", "oci/blobs/sha256/big/below-a-file"} {
		if _, err := raw.Open(name); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(%q): %v, want not found", name, err)
		}
	}
	if _, err := raw.Open("many"); err == nil {
		t.Error("Open of a directory: no error")
	}

	// A compressed filesystem is left to go-diskfs's reader.
	if _, err := OpenRaw(bytes.NewReader(packImage(t, tree, "zstd"))); !errors.Is(err, ErrNotRaw) {
		t.Errorf("compressed filesystem: %v, want ErrNotRaw", err)
	}
}

// A flipped byte in a file's data reads back flipped (the check that uses
// this reader then fails), and a damaged block list is an error, not a read
// elsewhere.
func TestRawSquashfsDamage(t *testing.T) {
	tree := fixtures.StageTree(t)
	data := packImage(t, tree, "")
	want, _ := os.ReadFile(filepath.Join(tree, "oci/blobs/sha256/big"))
	i := bytes.Index(data, want[:4096])
	if i < 0 {
		t.Fatal("file data not found in the image")
	}
	data[i+100] ^= 0xff
	got, err := fs.ReadFile(mustRaw(t, data), "oci/blobs/sha256/big")
	if err != nil || bytes.Equal(got, want) || len(got) != len(want) {
		t.Fatalf("flipped byte: err %v, same bytes %v", err, bytes.Equal(got, want))
	}
	// An image that ends inside the file: the read fails instead of
	// returning short data.
	raw := mustRaw(t, data)
	f, err := raw.Open("oci/blobs/sha256/big")
	if err != nil {
		t.Fatal(err)
	}
	raw.r = bytes.NewReader(data[:i+MiB/2])
	if _, err := io.ReadAll(f); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read past the end of the image: %v, want unexpected EOF", err)
	}
}

func mustRaw(t *testing.T, data []byte) *Raw {
	t.Helper()
	raw, err := OpenRaw(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// FuzzRawSquashfs: whatever bytes a damaged image holds, the raw reader
// returns errors or data, never panics or allocates without bound.
func FuzzRawSquashfs(f *testing.F) {
	tree := filepath.Join(f.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(tree, "oci/blobs/sha256"), 0o755); err != nil {
		f.Fatal(err)
	}
	for i, n := range []int{0, 1, 5000, MiB + 3} {
		if err := os.WriteFile(filepath.Join(tree, "oci/blobs/sha256", fmt.Sprint(i)), bytes.Repeat([]byte{byte(i + 1)}, n), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	image := packImage(f, tree, "")
	f.Add(uint32(0), byte(0))
	f.Add(uint32(40), byte(0x7f)) // bytes_used
	f.Add(uint32(len(image)-100), byte(0xff))
	f.Fuzz(func(t *testing.T, at uint32, x byte) {
		data := append([]byte(nil), image...)
		data[int(at)%len(data)] ^= x
		raw, err := OpenRaw(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i := 0; i < 4; i++ {
			if file, err := raw.Open(fmt.Sprintf("oci/blobs/sha256/%d", i)); err == nil {
				io.Copy(io.Discard, io.LimitReader(file, 4*MiB))
			}
		}
	})
}

// packImage packs tree with kiln's mksquashfs flags and returns the image.
func packImage(tb testing.TB, tree, compression string) []byte {
	tb.Helper()
	disk := filepath.Join(tb.TempDir(), "fs.img")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	if _, err := Write(context.Background(), Options{Tree: tree, Disk: disk, Compression: compression, SourceDateEpoch: fixtures.Epoch}); err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(disk)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// at reads f from offset on, to its end: a filesystem inside a disk file.
func at(f *os.File, offset int64) io.ReaderAt { return io.NewSectionReader(f, offset, 1<<62) }
