package verity

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/kiln-appliance/kiln/partitions/squashfs"
)

// BenchmarkVerityTree compares kiln's in-place hash tree with `veritysetup
// format` (the reference; it needs the partition as a file of its own) on
// the same 256 MiB of random data, page cache warm, in the same run.
func BenchmarkVerityTree(b *testing.B) {
	const size = 256 * mib
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
			if _, err := (Tree{Data: f, Out: f, DataBlocks: size / Block, HashOffset: size, Salt: salt}).Write(context.Background()); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("veritysetup", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			out, err := exec.Command("veritysetup", "format", data, data, fmt.Sprintf("--hash-offset=%d", size),
				fmt.Sprintf("--data-blocks=%d", size/Block), "--salt="+strings.Repeat("00", 32),
				"--uuid=00000000-0000-0000-0000-000000000000").CombinedOutput()
			if err != nil {
				b.Fatalf("veritysetup: %v\n%s", err, out)
			}
		}
	})
}

// BenchmarkVerityAndFiles prices the one read that hashes both the verity
// tree and the files in it (the data level feeding Files) against the two
// reads it replaced (the tree, then every file's sha256 with one reader per
// CPU), on 256 MiB of random data cut into 8 contiguous files.
func BenchmarkVerityAndFiles(b *testing.B) {
	const size, nfiles = 256 * mib, 8
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
	feeder := func() *Files {
		ff := &Files{}
		for i := int64(0); i < nfiles; i++ {
			n := int64(size / nfiles)
			ff.files = append(ff.files, &fileHasher{File: squashfs.File{Path: fmt.Sprint(i), Size: n, Start: i * n, Extents: []squashfs.Extent{{Off: i * n, N: n}}}, h: sha256.New()})
		}
		return ff
	}
	b.Run("one-read", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			ff := feeder()
			if _, err := (Tree{Data: f, Out: f, DataBlocks: size / Block, HashOffset: size, Salt: salt, Files: ff}).Write(context.Background()); err != nil {
				b.Fatal(err)
			}
			if _, err := ff.Finish(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("two-reads", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			if _, err := (Tree{Data: f, Out: f, DataBlocks: size / Block, HashOffset: size, Salt: salt}).Write(context.Background()); err != nil {
				b.Fatal(err)
			}
			var g errgroup.Group
			g.SetLimit(runtime.GOMAXPROCS(0))
			for _, fh := range feeder().files {
				g.Go(func() error {
					_, err := io.CopyBuffer(fh.h, io.NewSectionReader(f, fh.Start, fh.Size), make([]byte, mib))
					return err
				})
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
