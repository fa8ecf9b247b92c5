package sqfswrite

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkWrite times this writer, mksquashfs with the flags bundles used
// (uncompressed, no fragments, -no-sparse, all root) and `cp -r` on the same
// tree — 256 MiB of random blobs and 1,000 small files, on a real disk, page
// cache warm — each followed by sync, in rounds that rotate which goes
// first. It reports the medians (and ranges) over paired.Runs rounds of
// cp's time over each writer's (its share of cp's throughput).
//
//	go test -run '^$' -bench BenchmarkWrite -benchtime 1x ./partitions/sqfswrite
func BenchmarkWrite(b *testing.B) {
	dir, err := os.MkdirTemp("/var/tmp", "kiln-bench-sqfswrite-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tree := filepath.Join(dir, "tree", "blobs")
	if err := os.MkdirAll(tree, 0o755); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 32<<20)
	for i := range 8 {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(tree, fmt.Sprintf("big-%d", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 1000 {
		if err := os.WriteFile(filepath.Join(tree, fmt.Sprintf("small-%04d", i)), buf[:i*17], 0o644); err != nil {
			b.Fatal(err)
		}
	}
	src := filepath.Dir(tree)
	out := filepath.Join(dir, "out")
	run := func(f func() error) time.Duration {
		os.RemoveAll(out)
		exec.Command("sync").Run()
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		if err := exec.Command("sync").Run(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	tools := []func() time.Duration{
		func() time.Duration { // cp
			return run(func() error { return exec.Command("cp", "-r", src, out).Run() })
		},
		func() time.Duration { // mksquashfs
			return run(func() error {
				cmd := exec.Command("mksquashfs", src, out, "-noappend", "-no-duplicates", "-b", "1M", "-no-progress", "-quiet",
					"-mem", "64M", "-noI", "-noD", "-noF", "-noX", "-no-fragments", "-all-root", "-no-sparse")
				cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1")
				if o, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("mksquashfs: %v: %s", err, o)
				}
				return nil
			})
		},
		func() time.Duration { // sqfswrite
			return run(func() error {
				p, err := Scan(src, WithModTime(1))
				if err != nil {
					return err
				}
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				return p.Write(context.Background(), f, 0, nil)
			})
		},
	}
	b.ResetTimer()
	for range b.N {
		var mksq, own []float64
		var times [3][]time.Duration
		for round := range paired.Runs {
			var t [3]time.Duration
			for k := range 3 {
				i := (round + k) % 3
				t[i] = tools[i]()
				times[i] = append(times[i], t[i])
			}
			mksq = append(mksq, t[0].Seconds()/t[1].Seconds())
			own = append(own, t[0].Seconds()/t[2].Seconds())
		}
		sort.Float64s(mksq)
		sort.Float64s(own)
		b.ReportMetric(own[len(own)/2], "sqfswrite/cp-median")
		b.ReportMetric(mksq[len(mksq)/2], "mksquashfs/cp-median")
		b.Logf("share of cp's throughput, median (range) over %d rounds: sqfswrite %.2f (%.2f–%.2f), mksquashfs %.2f (%.2f–%.2f); medians cp %v, mksquashfs %v, sqfswrite %v; load average %s",
			paired.Runs, own[len(own)/2], own[0], own[len(own)-1], mksq[len(mksq)/2], mksq[0], mksq[len(mksq)-1],
			paired.MedianDuration(times[0]).Round(time.Millisecond), paired.MedianDuration(times[1]).Round(time.Millisecond),
			paired.MedianDuration(times[2]).Round(time.Millisecond), paired.LoadAverage())
	}
}
