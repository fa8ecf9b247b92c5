package preload

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/types"
)

// BenchmarkPreload builds a store from a few hundred MB of incompressible
// images and, in the same run, has skopeo copy the same images into a
// fresh store, the way one would without kiln. Run with -benchtime 1x:
//
//	go test -tags containers_image_openpgp,exclude_graphdriver_btrfs -run '^$' -bench Preload -benchtime 1x ./builder/preload/
func BenchmarkPreload(b *testing.B) {
	const nImages, nLayers, layerSize = 2, 2, 64 << 20
	dir := b.TempDir()
	oci := filepath.Join(dir, "oci")
	var imgs []Image
	var total int64
	for i := range nImages {
		name := fmt.Sprintf("quay.io/kiln/bench%d:1", i)
		w, err := layers.Random(oci, name, uint64(i+1), nLayers, layerSize)
		if err != nil {
			b.Fatal(err)
		}
		imgs = append(imgs, Image{Name: name, LayoutDir: oci, Digest: w.Digest.String()})
		total += nLayers * layerSize
	}
	for i := 0; i < b.N; i++ {
		store := filepath.Join(dir, "store")
		os.RemoveAll(store)

		// The pre-scan alone (digest + tar check of every layer).
		start := time.Now()
		for _, img := range imgs {
			s, err := resolve(img, options{os: "linux", arch: "amd64"})
			if err != nil {
				b.Fatal(err)
			}
			raw, err := readBlob(oci, s.digest, 4<<20)
			if err != nil {
				b.Fatal(err)
			}
			m, err := manifest.FromBlob(raw, s.mediaType)
			if err != nil {
				b.Fatal(err)
			}
			var ls []types.BlobInfo
			for _, l := range m.LayerInfos() {
				ls = append(ls, l.BlobInfo)
			}
			if err := s.scanLayers(ls); err != nil {
				b.Fatal(err)
			}
		}
		scan := time.Since(start)

		start = time.Now()
		res, err := Build(context.Background(), store, imgs, WithTime(time.Unix(1700000000, 0)))
		if err != nil {
			b.Fatal(err)
		}
		kiln := time.Since(start)

		root, run := filepath.Join(dir, "skopeo-root"), filepath.Join(dir, "skopeo-run")
		os.RemoveAll(root)
		os.RemoveAll(run)
		start = time.Now()
		for _, img := range imgs {
			dest := fmt.Sprintf("containers-storage:[overlay@%s+%s]%s", root, run, img.Name)
			out, err := exec.Command("skopeo", "copy", "--quiet", "--preserve-digests", "oci:"+oci+":"+img.Name, dest).CombinedOutput()
			if err != nil {
				b.Fatalf("skopeo copy %s: %v\n%s", img.Name, err, out)
			}
		}
		sk := time.Since(start)
		// skopeo's store stays mounted over itself (the overlay driver's
		// private home mount); unmount before removing it.
		for _, m := range mountsUnder(b, dir) {
			if out, err := exec.Command("umount", m).CombinedOutput(); err != nil {
				b.Fatalf("umount %s: %v: %s", m, err, out)
			}
		}
		skSize, err := StoreSize(root)
		if err != nil {
			b.Fatal(err)
		}

		mb := float64(total) / 1e6
		b.ReportMetric(mb, "MB_layers")
		b.ReportMetric(scan.Seconds(), "scan_s")
		b.ReportMetric(kiln.Seconds(), "kiln_s")
		b.ReportMetric(mb/kiln.Seconds(), "kiln_MB/s")
		b.ReportMetric(float64(res.Size)/1e6, "kiln_store_MB")
		b.ReportMetric(sk.Seconds(), "skopeo_s")
		b.ReportMetric(mb/sk.Seconds(), "skopeo_MB/s")
		b.ReportMetric(float64(skSize)/1e6, "skopeo_store_MB")
	}
}
