package fetch

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/internal/filestamp"
)

// TestChecked: a recorded stamp vouches for its file only while nothing has
// written, replaced or re-timed it, and a file written just before it was
// stamped is never recorded.
func TestChecked(t *testing.T) {
	t.Parallel()
	data := []byte("layer bytes")
	d := v1.Descriptor{Size: int64(len(data)), Digest: v1.Hash{Algorithm: "sha256", Hex: "4c2b000000000000000000000000000000000000000000000000000000000000"}}
	// blobIn opens a cache and writes the blob into dir; aged, it is then
	// left past the racy window.
	blobIn := func(t *testing.T, dir string, aged bool) (*Cache, string) {
		c, err := Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "blob")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if aged {
			time.Sleep(filestamp.RacyWindow + 50*time.Millisecond)
		}
		return c, p
	}
	record := func(t *testing.T, c *Cache, p string) {
		s, err := StampOf(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.RecordChecked(d, s); err != nil {
			t.Fatal(err)
		}
	}
	checked := func(t *testing.T, c *Cache, p string) bool {
		s, err := StampOf(p)
		if err != nil {
			return false
		}
		return c.Checked(d, s)
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, c *Cache, p string)
		want   bool
	}{
		{"unchanged", func(*testing.T, *Cache, string) {}, true},
		{"written, same size", func(t *testing.T, _ *Cache, p string) {
			os.WriteFile(p, []byte("LAYER bytes"), 0o644)
		}, false},
		{"written, mtime put back", func(t *testing.T, _ *Cache, p string) {
			fi, _ := os.Stat(p)
			os.WriteFile(p, []byte("LAYER bytes"), 0o644)
			os.Chtimes(p, fi.ModTime(), fi.ModTime())
		}, false},
		{"replaced by another file", func(t *testing.T, _ *Cache, p string) {
			os.WriteFile(p+".new", data, 0o644)
			os.Rename(p+".new", p)
		}, false},
		{"record torn", func(t *testing.T, c *Cache, _ string) {
			os.WriteFile(c.checkedPath(d.Digest), []byte(`{"path":`), 0o644)
		}, false},
		{"removed", func(t *testing.T, _ *Cache, p string) { os.Remove(p) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, p := blobIn(t, t.TempDir(), true)
			if checked(t, c, p) {
				t.Fatal("checked before anything was recorded")
			}
			record(t, c, p)
			tc.change(t, c, p)
			if got := checked(t, c, p); got != tc.want {
				t.Errorf("checked = %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("on a filesystem not known to move ctime", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
			t.Fatalf("mount ramfs (the tests run as root): %v", err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		c, p := blobIn(t, dir, true)
		record(t, c, p)
		if checked(t, c, p) {
			t.Error("a file on ramfs was recorded")
		}
	})
	t.Run("written just before it was stamped", func(t *testing.T) {
		t.Parallel()
		c, p := blobIn(t, t.TempDir(), false)
		record(t, c, p)
		if checked(t, c, p) {
			t.Error("a file written within the racy window was recorded")
		}
	})
}
