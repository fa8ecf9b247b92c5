package squashfs_test

import (
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/disktest"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	. "github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/loopmount"
)

// TestOpenImagePartitionMatchesKernel reads the image partition with the
// go-diskfs squashfs reader and with the kernel's squashfs driver, on a tree
// past the sizes where go-diskfs's writer is known to break (a directory of
// 1,500 entries, files of several blocks, nesting), and wants the same
// names, sizes and bytes.
func TestOpenImagePartitionMatchesKernel(t *testing.T) {
	tree := fixtures.StageTree(t)
	many := filepath.Join(tree, "oci", "many", "deeper")
	if err := os.MkdirAll(many, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1500; i++ {
		if err := os.WriteFile(filepath.Join(many, fmt.Sprintf("entry-%04d", i)), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disk, layout := disktest.Assemble(t, disktest.Disk(t, tree))
	fsys, closer, err := OpenImagePartition(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if _, err := fs.Stat(fsys, contract.ContentsFile); err != nil {
		t.Fatalf("stat kiln.json: %v", err)
	}
	p, _ := layout.Find(contract.PartitionName)
	mnt := loopmount.Squashfs(t, disk, p.Offset, p.Size)

	want := walkHashes(t, os.DirFS(mnt))
	got := walkHashes(t, fsys)
	if len(want) < 1500 {
		t.Fatalf("kernel sees only %d files", len(want))
	}
	for name, h := range want {
		if got[name] != h {
			t.Errorf("%s: go-diskfs reads %q, kernel %q", name, got[name], h)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: seen by go-diskfs only", name)
		}
	}
}

// walkHashes maps every regular file to its size and sha256.
func walkHashes(t *testing.T, fsys fs.FS) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := fsys.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		out[p] = fmt.Sprintf("%d:%x", n, h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOpenImagePartitionErrors(t *testing.T) {
	if _, _, err := OpenImagePartition(fixtures.Base(t)); err == nil {
		t.Fatal("a base without an image partition opened")
	}
}
