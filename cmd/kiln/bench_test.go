package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkBuild builds a disk from synthetic images (random, incompressible
// layers, some shared, in a local oci: layout) and compares it with `cp` of
// the same bytes on the same disk, in pairs run alternately (test/paired):
// the ratio is what means something on a noisy machine. Ratios are times,
// build / cp (issue 15's target for a cold build: ≤ 1.25), as median and
// range over paired.Runs pairs. KILN_BENCH_SIZES (MiB, comma-separated)
// overrides the sizes; KILN_BENCH_KEEP=1 keeps the fixture (layout, base,
// recipes) to time a build by hand.
//
//	make bench   # or: go test -tags … -run '^$' -bench BenchmarkBuild -benchtime 1x ./cmd/kiln
func BenchmarkBuild(b *testing.B) {
	sizes := benchSizes(b, 1024, 4096)
	for _, mib := range sizes {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) { benchBuild(b, mib<<20) })
	}
}

func benchBuild(b *testing.B, total int64) {
	dir, err := os.MkdirTemp("/var/tmp", "kiln-bench-") // a real disk, not tmpfs
	if err != nil {
		b.Fatal(err)
	}
	if os.Getenv("KILN_BENCH_KEEP") == "" {
		defer os.RemoveAll(dir)
	} else {
		b.Logf("keeping %s (KILN_BENCH_KEEP)", dir)
	}
	const n = 24
	imgs, err := images.RandomImages(filepath.Join(dir, "oci"), n, total, 0.3, 1)
	if err != nil {
		b.Fatal(err)
	}
	if err := basedisk.Write(filepath.Join(dir, "base.raw")); err != nil {
		b.Fatal(err)
	}
	recipe := filepath.Join(dir, "bench.yaml")
	text := "apiVersion: kiln.dev/v1alpha1\nkind: Appliance\nname: bench\nversion: 1.0.0\nbase:\n  path: base.raw\nimages:\n"
	for _, img := range imgs {
		text += fmt.Sprintf("  - name: %s\n    source: oci:oci:%s\n", img.Ref, img.Ref)
	}
	if err := os.WriteFile(recipe, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	// The same appliance without dm-verity (its lock is the same: verity
	// changes no digest), to price the hash tree in the same run.
	plain := filepath.Join(dir, "plain.yaml")
	if err := os.WriteFile(plain, []byte(text+"imagePartition:\n  verity: false\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	env := append(os.Environ(), "XDG_CACHE_HOME="+cache)
	for _, r := range []string{recipe, plain} {
		if out, err := command(env, kilnBin, "lock", r).CombinedOutput(); err != nil {
			b.Fatalf("lock: %v\n%s", err, out)
		}
	}
	blobs := filepath.Join(dir, "oci", "blobs")
	bytes := duBytes(b, blobs)
	disk := filepath.Join(dir, "disk.raw")

	// Baseline: cp of the same blobs to the same disk, flushed.
	cp := func() time.Duration {
		os.RemoveAll(filepath.Join(dir, "cp"))
		return timed(b, env, "sh", "-c", "cp -r "+blobs+" "+filepath.Join(dir, "cp")+" && sync")
	}
	var peakRSS int64
	build := func(recipe string, cold bool) func() time.Duration {
		return func() time.Duration {
			if cold { // empty cache: every blob fetched, or checked in place
				os.RemoveAll(cache)
			}
			// The last build's disk goes before the clock starts, as cp's
			// copy does: freeing 1 GiB of extents is not writing a disk.
			os.Remove(disk)
			d, rss := timedRSS(b, env, kilnBin, "build", recipe, "-o", disk)
			peakRSS = max(peakRSS, rss)
			return d
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cold := paired.Compare(b, paired.Runs, cp, build(recipe, true))
		// Warm: a rebuild, cache full (for a local layout: of manifests only).
		warm := paired.Compare(b, paired.Runs, cp, build(recipe, false))
		// The same rebuild without the verity tree, against the rebuild.
		verity := paired.Compare(b, paired.Runs, build(plain, false), build(recipe, false))

		mb := float64(bytes) / (1 << 20)
		b.ReportMetric(mb, "MiB")
		paired.Report(b, "cold/cp", cold)
		paired.Report(b, "warm/cp", warm)
		paired.Report(b, "verity/noverity", verity)
		b.ReportMetric(float64(peakRSS)/(1<<20), "peakRSS-MiB")
		b.Logf("%.0f MiB in %d images: cp %v (median), build cold %v: cold/cp %s; warm %v: warm/cp %s; verity/noverity %s; peak RSS %d MiB; load average %s",
			mb, n, paired.MedianDuration(cold.Baseline), paired.MedianDuration(cold.Candidate), cold,
			paired.MedianDuration(warm.Candidate), warm, verity, peakRSS>>20, loadAverage())
	}
}

// loadAverage is /proc/loadavg's first three fields, for the record.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func command(env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = env
	return cmd
}

func timed(b *testing.B, env []string, name string, args ...string) time.Duration {
	d, _ := timedRSS(b, env, name, args...)
	return d
}

// timedRSS runs a command after a sync and returns its wall time, including a
// final sync so written data is on disk, and its peak resident memory.
func timedRSS(b *testing.B, env []string, name string, args ...string) (time.Duration, int64) {
	b.Helper()
	syscall.Sync()
	start := time.Now()
	cmd := command(env, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("%s: %v\n%s", name, err, out)
	}
	syscall.Sync()
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss * 1024
	return time.Since(start), rss
}

func duBytes(b *testing.B, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// benchSizes is KILN_BENCH_SIZES (MiB, comma-separated), else def.
func benchSizes(b *testing.B, def ...int64) []int64 {
	s := os.Getenv("KILN_BENCH_SIZES")
	if s == "" {
		return def
	}
	var sizes []int64
	for _, f := range splitComma(s) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("KILN_BENCH_SIZES: %v", err)
		}
		sizes = append(sizes, n)
	}
	return sizes
}
