package slotwrite

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkSlotWriteVsDD: a slot image written by Write from a stick's pack
// with no active slot to seed from (the worst case: every chunk read from the
// stick, checked and written) against `dd bs=4M conv=fsync` of the image
// itself (16 KiB chunks, the factory's average), each onto a fresh blank loop device backed by a file on the same
// filesystem, in pairs. The image is half random data, half zeros in 16 MiB
// runs, like a filesystem with free space (its zeros are one chunk in the
// pack, written many times). Reported: dd's time over Write's (throughput
// ratio, target >= 0.7).
func BenchmarkSlotWriteVsDD(b *testing.B) {
	mibs := 256
	if s := os.Getenv("KILN_BENCH_SLOT_MIB"); s != "" {
		mibs, _ = strconv.Atoi(s)
	}
	size := mibs << 20
	dir := b.TempDir()
	img := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{11})
	for off := 0; off < size; off += 16 << 20 {
		if (off/(16<<20))%2 == 0 {
			rng.Read(img[off:min(off+16<<20, size)])
		}
	}
	imgFile := filepath.Join(dir, "slot.img")
	packFile := filepath.Join(dir, "slot.pack")
	x := fixedIndexOf(img, 16<<10) // the factory's average chunk
	if err := os.WriteFile(imgFile, img, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(packFile, pack(x, nil, img), 0o644); err != nil {
		b.Fatal(err)
	}
	img = nil
	target := func() (string, func()) {
		return paired.BlankLoop(b, filepath.Join(dir, "target.raw"), int64(size))
	}

	b.ResetTimer()
	for range b.N {
		r := paired.Compare(b, paired.Runs, func() time.Duration {
			dev, detach := target()
			defer detach()
			t := time.Now()
			if out, err := exec.Command("dd", "if="+imgFile, "of="+dev, "bs=4M", "conv=fsync", "status=none").CombinedOutput(); err != nil {
				b.Fatalf("dd: %v\n%s", err, out)
			}
			return time.Since(t)
		}, func() time.Duration {
			dev, detach := target()
			defer detach()
			t := time.Now()
			out, err := os.OpenFile(dev, os.O_RDWR, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer out.Close()
			p, err := os.Open(packFile)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			if _, err := Write(context.Background(), out, int64(size), Source{Index: x, Pack: p}); err != nil {
				b.Fatal(err)
			}
			return time.Since(t)
		})
		r = r.Throughput()
		b.Logf("%d MiB: dd median %s, slot write median %s; slot write/dd throughput %s; load %s", mibs,
			paired.MedianDuration(r.Baseline), paired.MedianDuration(r.Candidate), r, paired.LoadAverage())
		paired.Report(b, "throughput-vs-dd", r)
	}
}
