package filedigest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// The digest of "hello\n", as sha256sum prints it.
const hello = "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"

func TestOf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, n, err := Of(p)
	if err != nil || d != hello || n != 6 {
		t.Fatalf("Of = %s, %d, %v; want %s, 6", d, n, err, hello)
	}
	if _, _, err := Of(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Fatalf("Of(missing) error = %v, want not exist", err)
	}
	// A directory opens but does not read: the error names it.
	dir := t.TempDir()
	if _, _, err := Of(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Of(dir) error = %v, want one naming %s", err, dir)
	}
}

func TestOfFS(t *testing.T) {
	fsys := fstest.MapFS{"a/f": {Data: []byte("hello\n")}}
	d, n, err := OfFS(fsys, "a/f")
	if err != nil || d != hello || n != 6 {
		t.Fatalf("OfFS = %s, %d, %v; want %s, 6", d, n, err, hello)
	}
	if _, _, err := OfFS(fsys, "b"); err == nil {
		t.Fatal("OfFS(missing) succeeded")
	}
}
