package partitions

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/diskfs/go-diskfs/filesystem/squashfs"
)

// A file linked into the tree from elsewhere is packed with the mode and
// owner Attrs give it, the original keeps its own; CheckFilesystem sees the
// bytes as written.
func TestAttrsAndCheckFilesystem(t *testing.T) {
	tree := stageTree(t)
	big := filepath.Join(tree, "oci/blobs/sha256/big")
	if err := os.Chmod(big, 0o600); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(big)
	if err != nil {
		t.Fatal(err)
	}
	opts := defaultOpts(t, tree)
	opts.Attrs = []FileAttrs{{Path: "oci/blobs/sha256/big", Mode: 0o644, UID: 4321, GID: 8765}}
	var seen [sha256.Size]byte
	calls := 0
	opts.CheckFilesystem = func(ctx context.Context, open func() (fs.FS, error)) error {
		calls++
		fsys, err := open()
		if err != nil {
			return err
		}
		f, err := fsys.Open("oci/blobs/sha256/big")
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		copy(seen[:], h.Sum(nil))
		return nil
	}
	disk, _ := assemble(t, opts)
	if calls != 1 || seen != sha256.Sum256(want) {
		t.Fatalf("CheckFilesystem: %d calls, saw %x, want one call seeing %x", calls, seen, sha256.Sum256(want))
	}
	if fi, _ := os.Stat(big); fi.Mode().Perm() != 0o600 {
		t.Errorf("the staged file's mode changed to %v", fi.Mode())
	}
	fsys, c, err := OpenImagePartition(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fi, err := fs.Stat(fsys, "oci/blobs/sha256/big")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := fi.Sys().(*squashfs.StatT)
	if fi.Mode().Perm() != 0o644 || st == nil || st.UID != 4321 || st.GID != 8765 {
		t.Errorf("packed file: mode %v, owner %+v; want 0644 owned by 4321:8765", fi.Mode(), st)
	}
	// Files Attrs does not name keep their own.
	fi, err = fs.Stat(fsys, "storage/overlay/l1/diff/ping")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := fi.Sys().(*squashfs.StatT); st == nil || st.UID != 1000 || st.GID != 1001 {
		t.Errorf("ping: owner %+v, want 1000:1001 as staged", st)
	}
}

// A failing check fails the assembly, whatever else went well.
func TestCheckFilesystemFails(t *testing.T) {
	opts := defaultOpts(t, stageTree(t))
	bad := errors.New("blob changed")
	opts.CheckFilesystem = func(context.Context, func() (fs.FS, error)) error { return fmt.Errorf("check: %w", bad) }
	out, err := os.CreateTemp(t.TempDir(), "disk-*.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	opts.Output = out
	if _, err := Assemble(context.Background(), opts); !errors.Is(err, bad) {
		t.Fatalf("Assemble with a failing check: %v, want it", err)
	}
}

// A path mksquashfs's pseudo file cannot carry is refused, not mangled.
func TestAttrsBadPath(t *testing.T) {
	for _, p := range []string{"", "/abs", "a b", "a\nb"} {
		if _, err := writeAttrs([]FileAttrs{{Path: p, Mode: 0o644}}); err == nil {
			t.Errorf("writeAttrs(%q): no error", p)
		}
	}
}
