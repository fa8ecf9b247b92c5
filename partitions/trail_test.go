package partitions

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// trailReader lets a read through only once the writer has passed its end
// (and the first block only once the writer is done), reads a trailing
// hole the file does not reach yet as zeros, and fails with the writer.
func TestTrailReader(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "fs"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g := newTrailGate()
	r := trailReader{g, f}
	read := func(off, n int64) <-chan error {
		c := make(chan error, 1)
		go func() {
			b := make([]byte, n)
			_, err := r.ReadAt(b, off)
			for i := int64(0); err == nil && i < n; i += 4096 { // each block as written: 7s, or a hole
				blk := b[i : i+4096]
				if !bytes.Equal(blk, bytes.Repeat([]byte{7}, 4096)) && !bytes.Equal(blk, make([]byte, 4096)) {
					err = errors.New("read other bytes than written")
				}
			}
			c <- err
		}()
		return c
	}
	blocked := func(c <-chan error, what string) {
		t.Helper()
		select {
		case err := <-c:
			t.Fatalf("%s: not held back (%v)", what, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	through := func(c <-chan error, what string) {
		t.Helper()
		select {
		case err := <-c:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still held back", what)
		}
	}
	f.WriteAt(bytes.Repeat([]byte{7}, 4096), 4096)
	ahead, first := read(4096, 8192), read(0, 4096)
	blocked(ahead, "a read past the writer")
	g.passed(8192)
	blocked(ahead, "a read past the writer")
	g.passed(3 * 4096) // the file is 8 KiB: its last 4 KiB a hole not reached yet
	through(ahead, "a read behind the writer")
	blocked(first, "the superblock's block before the end")
	g.finish(nil)
	through(first, "the first block once done")

	g = newTrailGate()
	r.g = g
	c := read(4096, 4096)
	g.finish(errors.New("disk full"))
	if err := <-c; err == nil || !bytes.Contains([]byte(err.Error()), []byte("disk full")) {
		t.Errorf("read after the writer failed: %v", err)
	}
}
