package fetch

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// BenchmarkFetch fetches 8 random images (KILN_BENCH_BYTES of distinct
// layers, default 4 GiB, a quarter shared) into an empty cache, from an OCI
// layout and from a disk-backed loopback registry, then again with the
// cache warm. It reports throughput and the peak Go heap, which must stay
// small: blobs stream.
//
//	make bench   # or: go test -tags … -run '^$' -bench Fetch -benchtime 1x ./builder/fetch
func BenchmarkFetch(b *testing.B) {
	total := int64(4 << 30)
	if s := os.Getenv("KILN_BENCH_BYTES"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("KILN_BENCH_BYTES=%q: %v", s, err)
		}
		total = n
	}
	work := b.TempDir()
	src := filepath.Join(work, "oci")
	start := time.Now()
	imgs, err := images.RandomImages(src, 8, total, 0.25, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("RandomImages: %d MiB in %v (%.0f MiB/s)", total>>20, time.Since(start).Round(time.Millisecond), float64(total)/(1<<20)/time.Since(start).Seconds())

	// A registry whose blobs live on disk, so the benchmark's memory is ours.
	if err := os.MkdirAll(filepath.Join(work, "registry"), 0o755); err != nil {
		b.Fatal(err)
	}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithBlobHandler(registry.NewDiskBlobHandler(filepath.Join(work, "registry"))))
	srv := httptest.NewServer(h)
	defer srv.Close()
	reg := &testRegistry{host: strings.TrimPrefix(srv.URL, "http://")}
	var refs []string
	for _, img := range imgs {
		refs = append(refs, img.Ref)
	}
	pushLayout(b, reg, src, refs)

	requests := func(transport string) []Request {
		var reqs []Request
		for _, img := range imgs {
			s := "oci:" + src + ":" + img.Ref
			if transport == "docker" {
				_, repoTag, _ := strings.Cut(img.Ref, "/")
				s = "docker://" + reg.host + "/" + repoTag
			}
			reqs = append(reqs, Request{Source: s, Digest: img.Digest, Platform: amd64})
		}
		return reqs
	}
	for _, transport := range []string{"oci", "docker"} {
		b.Run(transport, func(b *testing.B) {
			reqs := requests(transport)
			for i := 0; i < b.N; i++ {
				dir := filepath.Join(work, "cache-"+transport)
				os.RemoveAll(dir)
				c, err := Open(dir)
				if err != nil {
					b.Fatal(err)
				}
				stop := peakHeap()
				b.SetBytes(total)
				b.ResetTimer()
				if _, err := c.FetchAll(context.Background(), reqs, nil); err != nil {
					b.Fatal(err)
				}
				cold := b.Elapsed()
				b.StopTimer()
				peak := stop()
				b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")

				start := time.Now()
				if _, err := c.FetchAll(context.Background(), reqs, nil); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "warm-ms")
				b.Logf("%s: cold %v, warm %v, peak heap %d MiB", transport, cold.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), peak>>20)
				os.RemoveAll(dir)
			}
		})
	}
}

// peakHeap samples the Go heap until the returned func is called, which
// returns the largest HeapInuse seen.
func peakHeap() func() uint64 {
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); return peak.Load() }
}
