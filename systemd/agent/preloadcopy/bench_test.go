package preloadcopy

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
)

// BenchmarkCopyToMainStore times mode "copy" at first boot: a few hundred
// MB of incompressible images from the read-only loop-mounted squashfs
// store into an empty main store, and the second (no-op) run.
//
//	go test -tags containers_image_openpgp,exclude_graphdriver_btrfs -run '^$' -bench CopyToMainStore -benchtime 1x ./systemd/agent/preloadcopy/
func BenchmarkCopyToMainStore(b *testing.B) {
	const nImages, nLayers, layerSize = 2, 2, 64 << 20
	dir := b.TempDir()
	oci := filepath.Join(dir, "oci")
	var written []layers.Written
	for i := range nImages {
		w, err := layers.Random(oci, fmt.Sprintf("quay.io/kiln/bench%d:1", i), uint64(i+1), nLayers, layerSize)
		if err != nil {
			b.Fatal(err)
		}
		written = append(written, w)
	}
	mnt := squashed(b, dir, oci, written)
	for i := 0; i < b.N; i++ {
		main := scratch(b)
		root, run := filepath.Join(main, "root"), filepath.Join(main, "run")
		start := time.Now()
		if err := CopyToMainStore(context.Background(), mnt, root, WithRunRoot(run), WithLog(&bytes.Buffer{})); err != nil {
			b.Fatal(err)
		}
		first := time.Since(start)
		start = time.Now()
		if err := CopyToMainStore(context.Background(), mnt, root, WithRunRoot(run), WithLog(&bytes.Buffer{})); err != nil {
			b.Fatal(err)
		}
		again := time.Since(start)
		mb := float64(nImages*nLayers*layerSize) / 1e6
		b.ReportMetric(mb, "MB_layers")
		b.ReportMetric(first.Seconds(), "copy_s")
		b.ReportMetric(mb/first.Seconds(), "copy_MB/s")
		b.ReportMetric(float64(again.Milliseconds()), "noop_ms")
	}
}
