package bundleimport

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// TestReceive: parts are copied from their ranges of a real file and kept
// under their digests only when they hash as told; a damaged part keeps
// nothing; a source that ends early keeps the parts before it; no temp file
// is ever left.
func TestReceive(t *testing.T) {
	t.Parallel()
	const start = 4096 // the filesystem's offset in the source
	data := make([]byte, 3<<20)
	rand.Read(data)
	digest := func(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }
	part3 := func(off, n int64) part { return part{digest: digest(data[off : off+n]), offset: off, size: n} }
	parts := []part{part3(10, 1000), part3(5000, 2<<20), part3(5000+2<<20, 0), part3(3<<20-100, 100)}
	source := filepath.Join(t.TempDir(), "bundle")
	if err := os.WriteFile(source, append(make([]byte, start), data...), 0o644); err != nil {
		t.Fatal(err)
	}
	var receiveInto func(t *testing.T, dir, src string, wants []part) (string, error)
	names := func(ps []part) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.digest[len("sha256:"):])
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	receive := func(t *testing.T, src string, wants []part) (string, error) {
		return receiveInto(t, t.TempDir(), src, wants)
	}
	receiveInto = func(t *testing.T, dir, src string, wants []part) (string, error) {
		f, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		i := &importer{copying: func(string) {}}
		var keep []string
		for _, p := range parts {
			keep = append(keep, p.digest)
		}
		return dir, i.receive(context.Background(), bundleFS{f, start}, inbox{dir, keep}, wants, io.Discard)
	}
	stored := func(t *testing.T, dir string) []string {
		t.Helper()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if got := digest(b); got != "sha256:"+e.Name() {
				t.Errorf("%s holds %s", e.Name(), got)
			}
			// The registry reads the store as a dynamic user.
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("%s: mode %v, want 0644", e.Name(), fi.Mode().Perm())
			}
			out = append(out, e.Name())
		}
		return out
	}

	t.Run("every part", func(t *testing.T) {
		dir, err := receive(t, source, parts)
		if err != nil {
			t.Fatal(err)
		}
		if got := stored(t, dir); !slices.Equal(got, names(parts)) {
			t.Errorf("stored %v, want %v", got, names(parts))
		}
	})
	t.Run("every part, on tmpfs", func(t *testing.T) {
		// A filesystem that may refuse O_DIRECT: the writes fall back to
		// ordinary ones.
		dir, err := os.MkdirTemp("/dev/shm", "kiln-receive-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		if _, err := receiveInto(t, dir, source, parts); err != nil {
			t.Fatal(err)
		}
		if got := stored(t, dir); !slices.Equal(got, names(parts)) {
			t.Errorf("stored %v, want %v", got, names(parts))
		}
	})
	t.Run("another release's leftovers go, this one's stay", func(t *testing.T) {
		dir := t.TempDir()
		other := []byte("a blob of another release's pulled stick")
		mine := data[10:1010] // parts[0], left by this release's pulled stick
		for _, b := range [][]byte{other, mine} {
			if err := os.WriteFile(filepath.Join(dir, digest(b)[len("sha256:"):]), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := receiveInto(t, dir, source, parts[1:]); err != nil {
			t.Fatal(err)
		}
		if got := stored(t, dir); !slices.Equal(got, names(parts)) {
			t.Errorf("stored %v, want %v", got, names(parts))
		}
	})
	t.Run("a damaged part keeps nothing", func(t *testing.T) {
		bad := slices.Clone(parts)
		bad[3].digest = digest([]byte("something else"))
		dir, err := receive(t, source, bad)
		if !errors.Is(err, bundlefmt.ErrDamaged) {
			t.Fatalf("got %v, want the bundle refused as damaged", err)
		}
		if got := stored(t, dir); len(got) > 0 {
			t.Errorf("kept %v", got)
		}
	})
	t.Run("a source that ends early keeps what was finished", func(t *testing.T) {
		short := filepath.Join(t.TempDir(), "short")
		if err := os.WriteFile(short, append(make([]byte, start), data[:1<<20]...), 0o644); err != nil {
			t.Fatal(err)
		}
		dir, err := receive(t, short, parts)
		if err == nil || errors.Is(err, bundlefmt.ErrDamaged) {
			t.Fatalf("got %v, want a read error", err)
		}
		if got, want := stored(t, dir), names(parts[:1]); !slices.Equal(got, want) {
			t.Errorf("kept %v, want %v", got, want)
		}
	})
}
