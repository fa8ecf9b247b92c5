package seal_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/internal/disktest"
	. "github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// FuzzDiskReaders: every reader of disk metadata (the GPT reader behind
// gpt.Inspect, Verify with its seal and verity parsers, and the squashfs
// reader behind squashfs.OpenImagePartition) on a real small kiln disk with the
// fuzzer's byte flips applied: errors are fine, panics are not. The input
// is a list of (offset, xor) pairs; the seeds flip the squashfs superblock
// (among its fields the root inode reference, which go-diskfs follows inside Read),
// kiln.json, the GPT headers and entries, the verity superblock and the seal.
func FuzzDiskReaders(f *testing.F) {
	disk, _ := disktest.Sealed(f, false)
	fuzzDisk, err := os.ReadFile(disk)
	if err != nil {
		f.Fatal(err)
	}
	l, err := gpt.Read(bytes.NewReader(fuzzDisk), "disk")
	if err != nil {
		f.Fatal(err)
	}
	ip, _ := l.Find(contract.PartitionName)
	var js bytes.Buffer
	disktest.Contents.Encode(&js)
	jsAt := int64(bytes.Index(fuzzDisk[ip.Offset:], js.Bytes())) + ip.Offset
	for _, off := range []int64{ip.Offset + 8, ip.Offset + 32, ip.Offset + 33, ip.Offset + 40, ip.Offset + 64, ip.Offset + 88, jsAt + 10, 512 + 80, 1024 + 40,
		int64(len(fuzzDisk)) - 512 + 72, ip.Offset + ip.Size - Size + 10} {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			f.Add(flip(off, x))
		}
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, flips []byte) {
		img := append([]byte(nil), fuzzDisk...)
		for ; len(flips) >= 9; flips = flips[9:] {
			off := int64(binary.LittleEndian.Uint64(flips) % uint64(len(img)))
			img[off] ^= flips[8]
		}
		p := filepath.Join(dir, "disk.raw")
		if err := os.WriteFile(p, img, 0o600); err != nil {
			t.Fatal(err)
		}
		gpt.Inspect(p)
		Verify(context.Background(), p, VerifyOptions{})
		Verify(context.Background(), p, VerifyOptions{Booted: true})
		if fsys, c, err := squashfs.OpenImagePartition(p); err == nil {
			fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
				if err == nil && d.Type().IsRegular() {
					if r, err := fsys.Open(path); err == nil {
						io.Copy(io.Discard, r)
						r.Close()
					}
				}
				return nil
			})
			c.Close()
		}
	})
}

func flip(off int64, x byte) []byte {
	b := make([]byte, 9)
	binary.LittleEndian.PutUint64(b, uint64(off))
	b[8] = x
	return b
}
