package blockdev

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Direct reads what the device holds whatever the buffer's length and
// alignment, and says EOF where the device ends.
func TestDirectReadAt(t *testing.T) {
	data := make([]byte, 5<<20)
	rand.NewChaCha8([32]byte{3}).Read(data)
	dev := loop(t, int64(len(data)), data)
	d, err := OpenDirect(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, tc := range []struct {
		name     string
		off      int64
		n, shift int // bytes to read, into a buffer starting shift bytes past an aligned one
		got      int
		err      string
	}{
		{"aligned, whole blocks", 4096, 1 << 20, 0, 1 << 20, ""},
		{"aligned, the whole device", 0, 5 << 20, 0, 5 << 20, ""},
		{"unaligned buffer", 512, 8192, 1, 8192, ""},
		{"unaligned, more than a bounce buffer", 512, 5<<20 - 512, 3, 5<<20 - 512, ""},
		{"unaligned, past the end", 4 << 20, 2 << 20, 3, 1 << 20, "EOF"},
		{"ends inside a block", 1 << 20, 1000, 0, 1000, ""},
		{"past the end", 5 << 20, 4096, 0, 0, "EOF"},
		{"the last block and beyond", 5<<20 - 512, 4096, 0, 512, "EOF"},
		{"offset inside a block", 100, 4096, 0, 0, "not on a 512-byte block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := alignedBuffer(tc.n + tc.shift)[tc.shift:]
			n, err := d.ReadAt(buf, tc.off)
			if n != tc.got {
				t.Errorf("read %d bytes, want %d (%v)", n, tc.got, err)
			}
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("got %v, want %q", err, tc.err)
			}
			if n > 0 && !bytes.Equal(buf[:n], data[tc.off:tc.off+int64(n)]) {
				t.Error("the bytes read are not the device's")
			}
			if tc.err == "EOF" && !errors.Is(err, io.EOF) {
				t.Errorf("%v is not io.EOF", err)
			}
		})
	}
}

// A read-back must see what the device holds, not the kernel's cache of
// it: change the loop device's backing file behind the cache's back, and
// a cached read sees the old bytes, a direct one the new.
func TestDirectBypassesTheCache(t *testing.T) {
	dev := loop(t, 1<<20, nil)
	backing := strings.TrimSpace(readSys("/sys/block/"+filepath.Base(dev), "loop/backing_file"))
	cached, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer cached.Close()
	b := make([]byte, 4096)
	if _, err := cached.ReadAt(b, 0); err != nil { // now in the cache: zeros
		t.Fatal(err)
	}
	f, err := os.OpenFile(backing, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("changed"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := cached.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if bytes.HasPrefix(b, []byte("changed")) {
		t.Fatal("a cached read saw the change: this test cannot tell a direct read from a cached one here")
	}
	d, err := OpenDirect(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("changed")) {
		t.Fatalf("the direct read saw the cache, not the device: %q", b[:7])
	}
}
