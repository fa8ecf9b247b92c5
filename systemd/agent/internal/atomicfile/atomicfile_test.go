package atomicfile

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestConcurrentWriterKeepsItsTemp: a second writer of the same target
// removes abandoned temp files, never the one a live writer is about to
// rename (it waits for the writer's lock). Had it removed it, the first
// writer's rename would fail.
func TestConcurrentWriterKeepsItsTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf.d", "50.conf")
	tempDir := dir
	abandoned := filepath.Join(tempDir, ".50.conf.tmp-abandoned")
	os.WriteFile(abandoned, []byte("half"), 0o644)

	paused, resume := make(chan string), make(chan struct{})
	firstDone := make(chan error)
	go func() {
		firstDone <- WriteFile(path, []byte("first"), 0o644, WithTempDir(tempDir), BeforeRename(func(tmp string) {
			paused <- tmp
			<-resume
		}))
	}()
	tmp := <-paused
	secondDone := make(chan error)
	go func() { secondDone <- WriteFile(path, []byte("second"), 0o644, WithTempDir(tempDir)) }()
	time.Sleep(200 * time.Millisecond) // let the second writer run into the lock
	if _, err := os.Stat(tmp); err != nil {
		t.Errorf("a live writer's temp file was removed: %v", err)
	}
	close(resume)
	if err := <-firstDone; err != nil {
		t.Errorf("first writer: %v", err)
	}
	if err := <-secondDone; err != nil {
		t.Errorf("second writer: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "second" {
		t.Errorf("content %q, want the second writer's", b)
	}
	if _, err := os.Stat(abandoned); !os.IsNotExist(err) {
		t.Errorf("abandoned temp file not removed: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(tempDir, ".50.conf.tmp-*")); len(m) > 0 {
		t.Errorf("temp files left: %v", m)
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
