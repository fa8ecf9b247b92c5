package reflash

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkReflashVsDD: kiln agent reflash (each chunk of the stick checked
// and written, each region flushed and read back against the record while
// the next is written, the first chunk last) against `dd bs=4M conv=fsync`
// of the same image, each onto a fresh blank loop device backed by a file
// on the same filesystem, in pairs. The image is half random data, half
// zeros in 16 MiB runs, like a disk of partitions and free space. Reported:
// dd's time over reflash's (throughput ratio, target >= 0.8).
func BenchmarkReflashVsDD(b *testing.B) {
	mibs := 512
	if s := os.Getenv("KILN_BENCH_REFLASH_MIB"); s != "" {
		mibs, _ = strconv.Atoi(s)
	}
	size := int64(mibs) << 20
	dir := b.TempDir()
	payloadDir := filepath.Join(dir, "payload")
	os.Mkdir(payloadDir, 0o755)
	img := filepath.Join(payloadDir, recovery.DiskFile)
	c := recovery.NewChunker()
	f, err := os.Create(img)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{7})
	buf := make([]byte, 16<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		clear(buf)
		if (off/int64(len(buf)))%2 == 0 {
			rng.Read(buf)
		}
		f.Write(buf)
		c.Write(buf)
	}
	f.Close()
	rec := recovery.Record{}
	c.Fill(&rec)
	writeRecord(b, payloadDir, rec)

	var console io.Writer = io.Discard
	if os.Getenv("KILN_BENCH_VERBOSE") != "" {
		console = os.Stderr
	}
	target := func() (string, func()) {
		return paired.BlankLoop(b, filepath.Join(dir, "target.raw"), int64(size))
	}

	b.ResetTimer()
	for range b.N {
		r := paired.Compare(b, paired.Runs, func() time.Duration {
			dev, detach := target()
			defer detach()
			t := time.Now()
			if out, err := exec.Command("dd", "if="+img, "of="+dev, "bs=4M", "conv=fsync", "status=none").CombinedOutput(); err != nil {
				b.Fatalf("dd: %v\n%s", err, out)
			}
			return time.Since(t)
		}, func() time.Duration {
			dev, detach := target()
			defer detach()
			t := time.Now()
			if err := Run(context.Background(), payloadDir, WithCandidates(dev), WithUnattended(), WithPowerOff(nil),
				WithConsole(nil, console)); err != nil {
				b.Fatal(err)
			}
			return time.Since(t)
		})
		r = r.Throughput()
		b.Logf("%d MiB: dd median %s, reflash median %s; reflash/dd throughput %s; load %s", mibs,
			paired.MedianDuration(r.Baseline), paired.MedianDuration(r.Candidate), r, paired.LoadAverage())
		paired.Report(b, "throughput-vs-dd", r)
	}
}
