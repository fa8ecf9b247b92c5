package squashfs

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	"github.com/kiln-appliance/kiln/partitions/sqfswrite"
)

// kiln's raw reader and go-diskfs's read what kiln's own squashfs writer
// (the bundle's) wrote: a directory of 1,500 entries (extended inode, index, several
// headers), files of one block, several and none, each byte as staged.
func TestRawSquashfsReadsWhatSqfswriteWrote(t *testing.T) {
	tree := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(tree, "oci/blobs/sha256"), 0o755))
	for i := range 1500 {
		must(os.WriteFile(filepath.Join(tree, fmt.Sprintf("oci/blobs/sha256/%064x", i)), []byte(fmt.Sprint(i)), 0o444))
	}
	big := make([]byte, 3*MiB+17)
	for i := range big {
		big[i] = byte(i * 31)
	}
	must(os.WriteFile(filepath.Join(tree, "big"), big, 0o644))
	must(os.WriteFile(filepath.Join(tree, "exact"), bytes.Repeat([]byte("k"), MiB), 0o644))
	must(os.WriteFile(filepath.Join(tree, "empty"), nil, 0o644))

	plan, err := sqfswrite.Scan(tree, sqfswrite.WithModTime(fixtures.Epoch))
	must(err)
	f, err := os.Create(filepath.Join(t.TempDir(), "fs.img"))
	must(err)
	defer f.Close()
	const offset = 5 * 4096
	must(plan.Write(context.Background(), f, offset, nil))
	raw, err := OpenRaw(at(f, offset))
	must(err)
	n, err := readsTree(raw, tree)
	must(err)
	if n != 1503 {
		t.Fatalf("compared %d files", n)
	}
	// go-diskfs's reader, which `kiln verify` walks the bundle with.
	fsys, closer, err := Open(f.Name(), offset, plan.Size())
	must(err)
	defer closer.Close()
	if n, err = readsTree(fsys, tree); err != nil || n != 1503 {
		t.Fatalf("go-diskfs: compared %d files: %v", n, err)
	}
}

// readsTree reads every regular file of tree through raw and compares it
// with the staged one; it returns how many it compared.
func readsTree(raw fs.FS, tree string) (int, error) {
	n := 0
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := fs.ReadFile(raw, filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("%s: read %d bytes that differ from the %d staged", rel, len(got), len(want))
		}
		n++
		return nil
	})
	return n, err
}
