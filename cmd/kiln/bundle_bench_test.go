//go:build !nodeonly

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkBundle measures upgrade bundles on synthetic releases: 1.0 is 24
// random images (30 % of their bytes in shared layers); 1.1 replaces 6 of
// them with new ones. It reports
//   - a delta's overhead: the stick image's (and the file's) bytes beyond the
//     payload it must carry (new blobs, release files, agent), as a fraction
//     of the new blobs (target ≤ 1 %);
//   - a full bundle's build throughput against `cp` of the same blob bytes,
//     both followed by sync, paired in the same run (target ≥ 0.8; median
//     and range over paired.Runs pairs).
//
// KILN_BENCH_SIZES (MiB of release 1.0, comma-separated) overrides the size;
// KILN_BENCH_KEEP=1 keeps the inputs (cache, recipes, key) to time by hand.
//
//	go test -tags … -run '^$' -bench BenchmarkBundle -benchtime 1x ./cmd/kiln
func BenchmarkBundle(b *testing.B) { benchBySize(b, benchBundle, 1024) }

func benchBundle(b *testing.B, total int64) {
	d := newBenchDir(b, "kiln-bench-bundle-")
	dir, env := d.dir, d.env
	const n, replaced = 24, 6
	old, err := images.RandomImages(d.path("oci10"), n, total, 0.3, 1)
	if err != nil {
		b.Fatal(err)
	}
	fresh, err := images.RandomImages(d.path("oci11"), replaced, total*replaced/n, 0, 2)
	if err != nil {
		b.Fatal(err)
	}
	f := &fixture{dir: dir, cache: filepath.Join(dir, "cache")}
	// Release 1.x: the first n-newImages of 1.0's images, then newImages new ones.
	release := func(newImages int) (out []benchImage) {
		for _, img := range old[:n-newImages] {
			out = append(out, benchImage{img.Ref, "oci10", img.Ref})
		}
		for i, img := range fresh[:newImages] {
			out = append(out, benchImage{fmt.Sprintf("bench.local/new-%d:1", i), "oci11", img.Ref})
		}
		return out
	}
	r10, r11 := d.recipe(b, "1.0.0", release(0)), d.recipe(b, "1.1.0", release(replaced))
	disk := d.path("disk-1.0.raw")
	d.kiln(b, []string{"build", r10, "-o", disk}, []string{"lock", r11})
	key := filepath.Join(dir, "k.key")

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Delta overhead, for the stick image and the file.
		delta, deltaFile := filepath.Join(dir, "delta.img"), filepath.Join(dir, "delta.kbundle")
		timed(b, env, kilnBin, "bundle", r11, "-o", delta, "--key", key, "--from", disk)
		timed(b, env, kilnBin, "bundle", r11, "-o", deltaFile, "--key", key, "--from", disk, "--format", "file")
		rep := inspectReport(b, f, delta)
		payload := rep.Manifest.Space.CopyBytes
		if rep.Manifest.AgentOnStick {
			payload += rep.Manifest.Agent.Size
		}
		for _, rf := range rep.Manifest.ReleaseFiles {
			payload += rf.Size
		}
		over := func(p string) float64 {
			fi, err := os.Stat(p)
			if err != nil {
				b.Fatal(err)
			}
			return float64(fi.Size()-payload) / float64(rep.Manifest.Space.CopyBytes)
		}
		overImg, overFile := over(delta), over(deltaFile)

		// Throughput of a full bundle against cp of the same blobs.
		blobs := filepath.Join(dir, "cp-src")
		os.RemoveAll(blobs)
		os.MkdirAll(blobs, 0o755)
		var bytes int64
		for _, bl := range rep.Manifest.Blobs {
			src := filepath.Join(dir, "cache", "kiln", "blobs", "sha256", bl.Digest[len("sha256:"):])
			if _, err := os.Stat(src); err != nil {
				b.Fatalf("blob cache layout changed? %v", err)
			}
			os.Link(src, filepath.Join(blobs, bl.Digest[len("sha256:"):]))
			bytes += bl.Size
		}
		full := filepath.Join(dir, "full.img")
		var rss int64
		bundleRun := func() time.Duration {
			os.Remove(full)
			d, r := timedRSS(b, env, kilnBin, "bundle", r11, "-o", full, "--key", key)
			rss = max(rss, r)
			return d
		}
		cpRun := func() time.Duration {
			os.RemoveAll(filepath.Join(dir, "cp"))
			return timed(b, env, "sh", "-c", "cp -r "+blobs+" "+filepath.Join(dir, "cp")+" && sync")
		}
		// The bundle as the "baseline", cp as the "candidate": the ratios are
		// cp's time over the bundle's, the bundle's share of cp's throughput.
		r := paired.Compare(b, paired.Runs, bundleRun, cpRun)
		tFull, tCP := paired.MedianDuration(r.Baseline), paired.MedianDuration(r.Candidate)
		// The full bundle is sound (its chunks were hashed while written).
		if out, err := command(env, kilnBin, "verify", full, "--key", filepath.Join(dir, "k.pub")).CombinedOutput(); err != nil {
			b.Fatalf("verify the full bundle: %v\n%s", err, out)
		}
		// Once more, untimed, for where the time goes (the steps' own lines).
		steps, _ := command(env, kilnBin, "bundle", r11, "-o", full, "--key", key).CombinedOutput()
		for _, line := range strings.Split(string(steps), "\n") {
			if strings.Contains(line, ": done") {
				b.Log(line)
			}
		}

		mb := float64(bytes) / (1 << 20)
		b.ReportMetric(overImg*100, "delta-overhead-%")
		paired.Report(b, "full/cp", r)
		b.Logf("delta: %s of new blobs, agent on stick %v; overhead beyond its payload: image %.3f %%, file %.3f %%. full bundle of %.0f MiB: cp %.2fs (%.0f MiB/s), bundle %.2fs (medians); bundle/cp throughput %s; peak RSS %d MiB; load average %s",
			bundleBytes(rep.Manifest.Space.CopyBytes), rep.Manifest.AgentOnStick, overImg*100, overFile*100, mb, tCP.Seconds(), mb/tCP.Seconds(), tFull.Seconds(), r, rss>>20, paired.LoadAverage())
	}
}

func inspectReport(b *testing.B, f *fixture, p string) *bundle.Report {
	out, err := command(append(os.Environ(), "XDG_CACHE_HOME="+f.cache), kilnBin, "inspect", "-o", "json", p).Output()
	if err != nil {
		b.Fatalf("inspect: %v", err)
	}
	var rep bundle.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		b.Fatal(err)
	}
	return &rep
}

func bundleBytes(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
