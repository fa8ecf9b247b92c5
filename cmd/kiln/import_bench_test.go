//go:build !nodeonly

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
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
func BenchmarkImport(b *testing.B) {
	sizes := benchSizes(b, 512)
	for _, mib := range sizes {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) { benchImport(b, mib<<20) })
	}
}

func benchImport(b *testing.B, total int64) {
	dir, err := os.MkdirTemp("/var/tmp", "kiln-bench-import-") // a real disk, not tmpfs
	if err != nil {
		b.Fatal(err)
	}
	if os.Getenv("KILN_BENCH_KEEP") == "" {
		defer os.RemoveAll(dir)
	} else {
		b.Logf("keeping %s (KILN_BENCH_KEEP)", dir)
	}
	factory, err := images.RandomImages(filepath.Join(dir, "oci10"), 1, 1<<20, 0, 1)
	if err != nil {
		b.Fatal(err)
	}
	fresh, err := images.RandomImages(filepath.Join(dir, "oci11"), 12, total, 0.3, 2)
	if err != nil {
		b.Fatal(err)
	}
	if err := basedisk.Write(filepath.Join(dir, "base.raw")); err != nil {
		b.Fatal(err)
	}
	env := append(os.Environ(), "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
	if out, err := command(env, kilnBin, "key", "generate", filepath.Join(dir, "k")).CombinedOutput(); err != nil {
		b.Fatalf("key: %v\n%s", err, out)
	}
	recipe := func(version, layout string, imgs []images.RandomImage) string {
		d := filepath.Join(dir, version)
		os.MkdirAll(d, 0o755)
		text := fmt.Sprintf("apiVersion: kiln.dev/v1alpha1\nkind: Appliance\nname: bench\nversion: %s\nbase:\n  path: ../base.raw\ntrust: [../k.pub]\nimages:\n", version)
		for _, img := range imgs {
			text += fmt.Sprintf("  - name: %s\n    source: oci:../%s:%s\n", img.Ref, layout, img.Ref)
		}
		p := filepath.Join(d, "bench.yaml")
		os.WriteFile(p, []byte(text), 0o644)
		return p
	}
	r10, r11 := recipe("1.0.0", "oci10", factory), recipe("1.1.0", "oci11", fresh)
	disk, full := filepath.Join(dir, "disk-1.0.raw"), filepath.Join(dir, "full.kbundle")
	for _, args := range [][]string{{"build", r10, "-o", disk}, {"lock", r11},
		{"bundle", r11, "-o", full, "--key", filepath.Join(dir, "k.key"), "--format", "file"}} {
		if out, err := command(env, kilnBin, args...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
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
		os.MkdirAll(filepath.Join(root, bundle.TrustDir), 0o755)
		os.WriteFile(filepath.Join(root, bundle.TrustDir, bundle.TrustFileName(pub)), pub, 0o644)
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
