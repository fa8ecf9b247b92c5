package atomicfile

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// A reader polling the file while it is rewritten must only ever see a whole
// version: old or new, never a prefix.
func TestNoPartialFileVisible(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "f.conf")
	versions := [][]byte{bytes.Repeat([]byte("a"), 1<<20), bytes.Repeat([]byte("b"), 3<<20)}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var reads, bad atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			data, err := os.ReadFile(path)
			if os.IsNotExist(err) {
				continue
			}
			reads.Add(1)
			if err != nil || !(bytes.Equal(data, versions[0]) || bytes.Equal(data, versions[1])) {
				bad.Add(1)
			}
		}
	}()
	for i := 0; i < 40; i++ {
		if err := WriteFile(path, versions[i%2], 0o640); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() > 0 || reads.Load() == 0 {
		t.Fatalf("%d of %d reads saw a partial file", bad.Load(), reads.Load())
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temp files left behind: %v", entries)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode())
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path); err != nil {
		t.Fatalf("removing a missing file: %v", err)
	}
}

func TestWriteFileError(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "is-a-dir")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(target, []byte("x"), 0o644); err == nil {
		t.Fatal("replacing a directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temp file left behind after failure: %v", entries)
	}
}

// A fill that fails leaves the old file and no temp file.
func TestWriteFailedFillKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Write(path, 0o644, func(w io.Writer) error {
		w.Write([]byte("half of the new"))
		return errors.New("digest mismatch")
	})
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %v, want one naming the path and the cause", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "old" {
		t.Errorf("file holds %q after a failed write, want the old content", data)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d entries in the directory, want only the file", len(entries))
	}
}

// CleanTemps removes exactly the temp files of one target.
func TestCleanTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "50-kiln-pins.conf")
	keep := []string{"50-kiln-pins.conf", "other.conf", ".other.conf.tmp-1", ".50-kiln-pins.confx.tmp-2"}
	for _, name := range append([]string{".50-kiln-pins.conf.tmp-123", ".50-kiln-pins.conf.tmp-abc"}, keep...) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := CleanTemps(path); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	sort.Strings(keep)
	if strings.Join(got, " ") != strings.Join(keep, " ") {
		t.Errorf("left %v, want %v", got, keep)
	}
	if err := CleanTemps(filepath.Join(dir, "missing", "f")); err != nil {
		t.Errorf("no directory: %v", err)
	}
}
