package base

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// A Disk gives each partition's bytes, raw or compressed alike; a
// compressed one's come from one pass of its decompression when they are
// asked for in disk order, each copied once, and one behind the stream
// starts it again.
func TestDiskPartitions(t *testing.T) {
	dir := t.TempDir()
	raw, zst := filepath.Join(dir, "ab.raw"), filepath.Join(dir, "ab.raw.zst")
	if err := basedisk.Write(raw, basedisk.WithABSlots(4<<20, 4<<20, "")); err != nil {
		t.Fatal(err)
	}
	if err := basedisk.Compress(raw, zst, "zstd"); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{raw, zst} {
		tmp := t.TempDir()
		d, err := OpenDisk(path, tmp)
		if err != nil {
			t.Fatal(err)
		}
		if d.Raw != (path == raw) {
			t.Fatalf("%s: Raw = %v", path, d.Raw)
		}
		ps := d.Layout.Partitions
		if len(ps) < 4 {
			t.Fatalf("%s: %d partitions, want at least 4", path, len(ps))
		}
		want := func(i int) []byte { return whole[ps[i].Offset : ps[i].Offset+ps[i].Size] }
		check := func(i int) {
			t.Helper()
			f, off, err := d.PartitionFile(ps[i])
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, ps[i].Size)
			fh, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			if _, err := fh.ReadAt(got, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want(i)) {
				t.Errorf("%s: partition %d: not the disk's bytes", path, ps[i].Number)
			}
		}
		check(1)
		stream := d.stream
		check(1) // again: the same copy
		rs, err := d.Partitions(ps[2], ps[3])
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range rs {
			got, err := io.ReadAll(io.NewSectionReader(r, 0, ps[2+k].Size))
			if err != nil || !bytes.Equal(got, want(2+k)) {
				t.Errorf("%s: Partitions: partition %d: not the disk's bytes (%v)", path, ps[2+k].Number, err)
			}
		}
		if !d.Raw && (d.stream != stream || len(d.copies) != 3) {
			t.Errorf("%s: asked in disk order, the partitions came from another pass (%d copies)", path, len(d.copies))
		}
		check(0) // behind the stream
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("%s: Close left %d entries in the temp dir", path, len(left))
		}
	}
}
