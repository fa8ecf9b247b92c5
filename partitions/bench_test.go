package partitions

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"golang.org/x/sync/errgroup"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// BenchmarkOpenBase measures streaming decompression of the fixture base
// (450 MiB, mostly zeros) by format.
func BenchmarkOpenBase(b *testing.B) {
	dir := bases(b)
	for _, name := range []string{"base.raw", "base.raw.gz", "base.raw.xz", "base.raw.zst"} {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r, err := OpenBase(filepath.Join(dir, name), "")
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, r)
				if err != nil {
					b.Fatal(err)
				}
				r.Close()
				b.SetBytes(n)
			}
		})
	}
}

// BenchmarkSquashfs measures the image partition's writer (writeSquashfs,
// uncompressed as by default: kiln's sqfswrite) writing a tree like an image
// partition (8 random 32 MiB blobs) at an offset of a file. The file is
// removed before each write: the writer refuses to write over bytes already
// there.
func BenchmarkSquashfs(b *testing.B) {
	tree := b.TempDir()
	buf := make([]byte, 32*MiB)
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
		if _, err := writeSquashfs(context.Background(), squashfsOptions{Tree: tree, Disk: disk, Offset: 450 * MiB, SourceDateEpoch: epoch}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerityTree compares kiln's in-place hash tree with `veritysetup
// format` (the reference; it needs the partition as a file of its own) on
// the same 256 MiB of random data, page cache warm, in the same run.
func BenchmarkVerityTree(b *testing.B) {
	const size = 256 * MiB
	dir := b.TempDir()
	data := filepath.Join(dir, "data")
	buf := make([]byte, size)
	if _, err := rand.Read(buf); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(data, buf, 0o644); err != nil {
		b.Fatal(err)
	}
	salt := make([]byte, 32)
	b.Run("kiln", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			f, err := os.OpenFile(data, os.O_RDWR, 0)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := writeVerity(context.Background(), f, f, size/VerityBlock, size, salt, [16]byte{}, nil, nil); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("veritysetup", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			out, err := exec.Command("veritysetup", "format", data, data, fmt.Sprintf("--hash-offset=%d", size),
				fmt.Sprintf("--data-blocks=%d", size/VerityBlock), "--salt="+strings.Repeat("00", 32),
				"--uuid=00000000-0000-0000-0000-000000000000").CombinedOutput()
			if err != nil {
				b.Fatalf("veritysetup: %v\n%s", err, out)
			}
		}
	})
}

// BenchmarkVerityAndFiles prices the one read that hashes both the verity
// tree and the files in it (hashLevel0 feeding a fileFeeder) against the two
// reads it replaced (the tree, then every file's sha256 with one reader per
// CPU), on 256 MiB of random data cut into 8 contiguous files.
func BenchmarkVerityAndFiles(b *testing.B) {
	const size, nfiles = 256 * MiB, 8
	path := filepath.Join(b.TempDir(), "data")
	buf := make([]byte, size)
	if _, err := rand.Read(buf); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		b.Fatal(err)
	}
	buf = nil
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	salt := make([]byte, 32)
	feeder := func() *fileFeeder {
		ff := &fileFeeder{}
		for i := int64(0); i < nfiles; i++ {
			n := int64(size / nfiles)
			ff.files = append(ff.files, &fileHasher{path: fmt.Sprint(i), size: n, start: i * n, extents: []fileExtent{{off: i * n, n: n}}, h: sha256.New()})
		}
		return ff
	}
	b.Run("one-read", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			ff := feeder()
			if _, err := writeVerity(context.Background(), f, f, size/VerityBlock, size, salt, [16]byte{}, ff, nil); err != nil {
				b.Fatal(err)
			}
			if _, err := ff.finish(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("two-reads", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			if _, err := writeVerity(context.Background(), f, f, size/VerityBlock, size, salt, [16]byte{}, nil, nil); err != nil {
				b.Fatal(err)
			}
			var g errgroup.Group
			g.SetLimit(runtime.GOMAXPROCS(0))
			for _, fh := range feeder().files {
				g.Go(func() error { return hashRead(context.Background(), fh.h, f, fh.start, fh.size, make([]byte, MiB)) })
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
