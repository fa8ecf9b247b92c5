package squashfs_test

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/internal/disktest"
	. "github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/test/loopmount"
)

// TestOpenImagePartitionBigFile reads a 1 GiB file (1,024 squashfs blocks,
// past any 32-bit block offset arithmetic in a reader) back through
// OpenImagePartition and through the kernel, streaming.
func TestOpenImagePartitionBigFile(t *testing.T) {
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "kiln.json"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := writePattern(t, filepath.Join(tree, "big"), 1<<30+4097)
	disk, l := disktest.Assemble(t, disktest.Disk(t, tree), partitions.WithIgnition(nil))

	fsys, closer, err := OpenImagePartition(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	f, err := fsys.Open("big")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := hashReader(t, f); got != want {
		t.Errorf("OpenImagePartition reads %s, staged %s", got, want)
	}
	p, _ := l.Find("kiln-images")
	mnt := loopmount.Squashfs(t, disk, p.Offset, p.Size)
	k, err := os.Open(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if got := hashReader(t, k); got != want {
		t.Errorf("kernel reads %s, staged %s", got, want)
	}
}

// writePattern writes n bytes no two 1 MiB blocks of which are equal, and
// returns "size:sha256".
func writePattern(t *testing.T, path string, n int64) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < n; off += int64(len(buf)) {
		for i := 0; i < len(buf); i += 8 {
			v := uint64(off) + uint64(i)
			buf[i], buf[i+1], buf[i+2], buf[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
			buf[i+4], buf[i+5], buf[i+6], buf[i+7] = byte(v>>32), 0x6b, 0x69, 0x6c
		}
		c := buf[:min(int64(len(buf)), n-off)]
		if _, err := f.Write(c); err != nil {
			t.Fatal(err)
		}
		h.Write(c)
	}
	return fmt.Sprintf("%d:%x", n, h.Sum(nil))
}

func hashReader(t *testing.T, r io.Reader) string {
	t.Helper()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%x", n, h.Sum(nil))
}
