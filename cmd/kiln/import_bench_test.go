//go:build !nodeonly

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkImport measures kiln agent import (the node edition, kiln-agent)
// of a full bundle file (12 random images, 30 % of their bytes in shared
// layers, none on the node's image partition) into a node tree on the same
// disk, against `cp` of the bundle file, both followed by sync, paired in
// the same run (target ≥ 0.7, median and range over paired.Runs pairs). The
// import reads each blob from its byte range, hashes it, writes the same
// bytes (O_DIRECT) and syncs the filesystem once. Both read the bundle from
// the page cache (it was just written; the machine is shared, so no cache
// is dropped).
//
// KILN_BENCH_SIZES (MiB of images, comma-separated) overrides the size;
// KILN_BENCH_KEEP=1 keeps the inputs (bundle, node tree) to time by hand.
//
//	go test -tags … -run '^$' -bench BenchmarkImport -benchtime 1x ./cmd/kiln
func BenchmarkImport(b *testing.B) { benchBySize(b, benchImport, 512) }

func benchImport(b *testing.B, total int64) {
	d := newBenchDir(b, "kiln-bench-import-")
	dir, env := d.dir, d.env
	factory, err := images.RandomImages(d.path("oci10"), 1, 1<<20, 0, 1)
	if err != nil {
		b.Fatal(err)
	}
	fresh, err := images.RandomImages(d.path("oci11"), 12, total, 0.3, 2)
	if err != nil {
		b.Fatal(err)
	}
	named := func(layout string, imgs []images.RandomImage) (out []benchImage) {
		for _, img := range imgs {
			out = append(out, benchImage{img.Ref, layout, img.Ref})
		}
		return out
	}
	r10, r11 := d.recipe(b, "1.0.0", named("oci10", factory)), d.recipe(b, "1.1.0", named("oci11", fresh))
	disk, full := d.path("disk-1.0.raw"), d.path("full.kbundle")
	d.kiln(b, []string{"build", r10, "-o", disk}, []string{"lock", r11},
		[]string{"bundle", r11, "-o", full, "--key", d.path("k.key"), "--format", "file"})
	fi, err := os.Stat(full)
	if err != nil {
		b.Fatal(err)
	}
	part := mountImagePartition(b, disk)
	pub, err := os.ReadFile(filepath.Join(dir, "k.pub"))
	if err != nil {
		b.Fatal(err)
	}

	mb := float64(fi.Size()) / (1 << 20)
	node := 0
	var peak int64
	imp := func() time.Duration {
		root := filepath.Join(dir, fmt.Sprintf("node-%d", node))
		node++
		img := filepath.Join(root, contract.MountPoint)
		os.MkdirAll(img, 0o755)
		data, _ := os.ReadFile(filepath.Join(part, contract.ContentsFile))
		os.WriteFile(filepath.Join(img, contract.ContentsFile), data, 0o644)
		os.Symlink(filepath.Join(part, contract.OCIDir), filepath.Join(img, contract.OCIDir))
		os.MkdirAll(filepath.Join(root, contract.TrustDir), 0o755)
		os.WriteFile(filepath.Join(root, contract.TrustDir, contract.TrustFileName(pub)), pub, 0o644)
		// The node edition, as the node runs it.
		d, rss := timedRSS(b, env, filepath.Join(filepath.Dir(kilnBin), "kiln-agent"), "agent", "import", full, "--root", root, "--apply-pins", "none")
		peak = max(peak, rss)
		os.RemoveAll(root) // the next run starts from an empty store
		return d
	}
	cp := func() time.Duration {
		d := timed(b, env, "sh", "-c", "cp "+full+" "+filepath.Join(dir, "cp.kbundle")+" && sync")
		os.Remove(filepath.Join(dir, "cp.kbundle"))
		return d
	}

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Import as the "baseline", cp as the "candidate": the ratios are
		// cp's time over the import's, the import's share of cp's throughput.
		r := paired.Compare(b, paired.Runs, imp, cp)
		paired.Report(b, "import/cp", r)
		tImport, tCP := paired.MedianDuration(r.Baseline), paired.MedianDuration(r.Candidate)
		b.ReportMetric(mb/tImport.Seconds(), "import-MiB/s")
		b.ReportMetric(mb/tCP.Seconds(), "cp-MiB/s")
		b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
		b.Logf("bundle %.0f MiB: cp %.2fs, import %.2fs (medians); import/cp throughput %s; peak RSS %d MiB; load average %s",
			mb, tCP.Seconds(), tImport.Seconds(), r, peak>>20, paired.LoadAverage())
	}
}
