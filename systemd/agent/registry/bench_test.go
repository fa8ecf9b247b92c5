package registry

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// The benchmarks compare kiln serve with go-containerregistry's
// pkg/registry serving the same image from memory, and with reading the
// files directly (the limit). `make bench` runs them; docs/BENCHMARKS.md has
// the figures.

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// benchTargets serves the image at dir through kiln and through
// go-containerregistry's registry, and returns both base URLs.
func benchTargets(b *testing.B, dir string) (kiln, ggcr string) {
	b.Helper()
	kiln = "http://" + serve(b, must(New([]string{dir}, WithLogger(quiet), WithRequestLog(false))))
	l := must(net.Listen("tcp", "127.0.0.1:0"))
	hs := &http.Server{Handler: ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))}
	go hs.Serve(l)
	b.Cleanup(func() { hs.Close() })
	ggcr = "http://" + l.Addr().String()
	img := must(must(layout.ImageIndexFromPath(dir)).IndexManifest()).Manifests[0]
	i := must(must(layout.FromPath(dir)).Image(img.Digest))
	if err := remote.Write(must(name.ParseReference(l.Addr().String()+"/quay.io/acme/big:1", name.Insecure)), i); err != nil {
		b.Fatal(err)
	}
	return kiln, ggcr
}

func fetch(b *testing.B, c *http.Client, url string, buf []byte) int64 {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{resp.Body}, buf)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return n
}

// BenchmarkBlob: throughput of one 256 MiB layer over loopback HTTP.
func BenchmarkBlob(b *testing.B) {
	const size = 256 << 20
	dir, layer := bigImage(b, size)
	kiln, ggcr := benchTargets(b, dir)
	path := "/v2/quay.io/acme/big/blobs/" + layer.String()
	buf := make([]byte, 1<<20)
	c := &http.Client{Transport: &http.Transport{}}
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			f := must(os.Open(filepath.Join(dir, "blobs", "sha256", layer.Hex)))
			io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
			f.Close()
		}
	})
	// The first full read of a blob is hashed; later ones go out by sendfile.
	b.Run("kiln-firstread", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			s := must(New([]string{dir}, WithLogger(quiet), WithRequestLog(false)))
			b.StartTimer()
			rec := &discardWriter{h: http.Header{}}
			s.ServeHTTP(rec, must(http.NewRequest("GET", path, nil)))
			if rec.n != size {
				b.Fatalf("%d bytes", rec.n)
			}
		}
	})
	fetch(b, c, kiln+path, buf) // verified from here on
	for _, t := range []struct{ name, base string }{{"kiln", kiln}, {"ggcr", ggcr}} {
		b.Run(t.name, func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				if n := fetch(b, c, t.base+path, buf); n != size {
					b.Fatalf("%d bytes", n)
				}
			}
		})
	}
}

// discardWriter is an http.ResponseWriter that counts and drops the body.
type discardWriter struct {
	h http.Header
	n int64
}

func (d *discardWriter) Header() http.Header { return d.h }
func (d *discardWriter) WriteHeader(int)     {}
func (d *discardWriter) Write(p []byte) (int, error) {
	d.n += int64(len(p))
	return len(p), nil
}

// BenchmarkManifest: latency of one manifest GET by tag (keep-alive).
func BenchmarkManifest(b *testing.B) {
	dir, _ := bigImage(b, 1024)
	kiln, ggcr := benchTargets(b, dir)
	d := must(must(layout.ImageIndexFromPath(dir)).IndexManifest()).Manifests[0].Digest
	buf := make([]byte, 32<<10)
	c := &http.Client{Transport: &http.Transport{}}
	b.Run("direct", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			must(os.ReadFile(filepath.Join(dir, "blobs", "sha256", d.Hex)))
		}
	})
	for _, t := range []struct{ name, base string }{{"kiln", kiln}, {"ggcr", ggcr}} {
		b.Run(t.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				fetch(b, c, t.base+"/v2/quay.io/acme/big/manifests/1", buf)
			}
		})
	}
}

// manyImages writes a layout of n images, 3 small layers each, each with a
// full ref.name, as a 200-image appliance partition would hold.
func manyImages(b *testing.B, n int) string {
	return manyImagesSeeded(b, filepath.Join(b.TempDir(), "oci"), n, 2, "1")
}

// manyImagesSeeded writes the layout into dir with its own random content
// (seed) and tag prefix.
func manyImagesSeeded(b *testing.B, dir string, n int, seed int64, tag string) string {
	rng := rand.New(rand.NewSource(seed))
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	adds := make([]mutate.IndexAddendum, n)
	for i := range adds {
		img := base
		for j := 0; j < 3; j++ {
			data := make([]byte, 512)
			rng.Read(data)
			img = must(mutate.AppendLayers(img, static.NewLayer(data, types.OCILayer)))
		}
		name := fmt.Sprintf("registry.example.com/team%d/app%d:%s.%d", i%10, i, tag, i)
		adds[i] = mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Annotations: map[string]string{ocispec.AnnotationRefName: name}}}
	}
	// index.json written once: appending image by image rewrites it each
	// time, which takes minutes at 2,000 images.
	must(layout.Write(dir, mutate.AppendManifests(empty.Index, adds...)))
	return dir
}

// releaseOf is the contract.Release of every named image in a layout, each
// of its blobs kept in the store.
func releaseOf(b *testing.B, dir, version string) contract.Release {
	idx := must(v1.ParseIndexManifest(must(os.Open(filepath.Join(dir, "index.json")))))
	r := contract.Release{Version: version}
	for _, m := range idx.Manifests {
		r.Images = append(r.Images, contract.Image{Name: m.Annotations[ocispec.AnnotationRefName], Digest: m.Digest.String(),
			MediaType: string(m.MediaType), Served: true})
	}
	for _, e := range must(os.ReadDir(filepath.Join(dir, "blobs", "sha256"))) {
		r.Blobs = append(r.Blobs, "sha256:"+e.Name())
	}
	return r
}

// BenchmarkStartup200: from nothing to a 200 answer on /v2/ with 200 images
// indexed (kiln), against only reading index.json and every manifest
// (direct, the least any server must do). kiln+state is the upgrade boot:
// the same partition, plus a state trying 200 other images whose blobs are
// all in the release store (the factory's 200 as current).
func BenchmarkStartup200(b *testing.B) {
	dir := manyImages(b, 200)
	store := filepath.Join(b.TempDir(), "releases")
	next := releaseOf(b, manyImagesSeeded(b, store, 200, 3, "2"), "2.0.0")
	stateFile := filepath.Join(b.TempDir(), "state.json")
	st := state.State{SchemaVersion: state.Version, Current: releaseOf(b, dir, "1.0.0"), Trying: &next}
	st.Current.Blobs = nil
	if err := os.WriteFile(stateFile, must(state.Encode(&st)), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Run("direct", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			readDirect(dir)
		}
	})
	for _, bc := range []struct {
		name string
		tags int
		opts []Option
	}{{"kiln", 200, nil}, {"kiln+state", 400, []Option{WithReleaseState(stateFile, store)}}} {
		b.Run(bc.name, func(b *testing.B) { startup(b, dir, bc.tags, bc.opts...) })
	}
}

// BenchmarkStartupScale: New + listen + READY + the first GET /v2/ in one
// process, for 2, 200 and 2,000 images (3 layers each), against reading
// index.json and every manifest (direct); kiln-prebuilt starts from the
// factory's prebuilt index of the same layout. It shows how the start grows with
// the images indexed; BenchmarkServeStartup (cmd/kiln) times the whole
// process against distribution.
func BenchmarkStartupScale(b *testing.B) {
	for _, n := range []int{2, 200, 2000} {
		dir := manyImages(b, n)
		b.Run(fmt.Sprintf("%dimages/direct", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				readDirect(dir)
			}
		})
		b.Run(fmt.Sprintf("%dimages/kiln", n), func(b *testing.B) { startup(b, dir, n) })
		writePrebuilt(b, dir) // from here on the layout has the factory's index
		b.Run(fmt.Sprintf("%dimages/kiln-prebuilt", n), func(b *testing.B) { startup(b, dir, n) })
	}
}

// readDirect reads index.json and every manifest it lists: the least any
// registry that checks its manifests at start must do.
func readDirect(dir string) {
	idx := must(v1.ParseIndexManifest(must(os.Open(filepath.Join(dir, "index.json")))))
	for _, m := range idx.Manifests {
		must(os.ReadFile(filepath.Join(dir, "blobs", "sha256", m.Digest.Hex)))
	}
}

// startup measures New + listen + READY + the first GET /v2/.
func startup(b *testing.B, dir string, tags int, opts ...Option) {
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan struct{})
		s := must(New([]string{dir}, append([]Option{WithLogger(quiet), WithRequestLog(false), WithReady(func(Stats) { close(ready) })}, opts...)...))
		l := must(net.Listen("tcp", "127.0.0.1:0"))
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, l) }()
		<-ready
		resp := must(http.Get("http://" + l.Addr().String() + "/v2/"))
		resp.Body.Close()
		if st := s.Stats(); resp.StatusCode != 200 || st.Tags != tags || st.Damaged != 0 {
			b.Fatalf("status %d, %+v", resp.StatusCode, st)
		}
		cancel()
		<-done
	}
}

// BenchmarkBlobChecks prices checking a blob against its digest before its
// bytes go out (a blob outside dm-verity, as in the release store or a
// plain directory): a 256 MiB layer fetched over loopback HTTP,
//
//	first-get   the first full GET of a fresh server (hashed as it streams)
//	repeat-get  a full GET of a blob a GET has checked
//	first-range a 1 MiB Range GET of a fresh server (no GET has checked it)
//	range       a 1 MiB Range GET of a checked blob
//
// Each server is started with the timer stopped.
func BenchmarkBlobChecks(b *testing.B) {
	const size, rangeSize = 256 << 20, 1 << 20
	dir, layer := bigImage(b, size)
	path := "/v2/quay.io/acme/big/blobs/" + layer.String()
	buf := make([]byte, 1<<20)
	c := &http.Client{Transport: &http.Transport{}}
	get := func(base string, ranged bool) {
		req := must(http.NewRequest(http.MethodGet, base+path, nil))
		want, status := int64(size), http.StatusOK
		if ranged {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", size/2, size/2+rangeSize-1))
			want, status = rangeSize, http.StatusPartialContent
		}
		resp := must(c.Do(req))
		n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{resp.Body}, buf)
		resp.Body.Close()
		if err != nil || n != want || resp.StatusCode != status {
			b.Fatalf("GET %s: %d, %d bytes, %v", path, resp.StatusCode, n, err)
		}
	}
	// fresh starts a server no request has reached and returns its base
	// URL and how to stop it.
	fresh := func() (string, func()) {
		s := must(New([]string{dir}, WithLogger(quiet), WithRequestLog(false)))
		l := must(net.Listen("tcp", "127.0.0.1:0"))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, l) }()
		c.CloseIdleConnections()
		return "http://" + l.Addr().String(), func() { cancel(); <-done }
	}
	for _, bc := range []struct {
		name          string
		ranged, first bool
	}{{"first-get", false, true}, {"repeat-get", false, false}, {"first-range", true, true}, {"range", true, false}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(size)
			if bc.ranged {
				b.SetBytes(rangeSize)
			}
			base, stop := fresh()
			if !bc.first {
				get(base, false) // checked from here on
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if bc.first && i > 0 {
					b.StopTimer()
					stop()
					base, stop = fresh()
					b.StartTimer()
				}
				get(base, bc.ranged)
			}
			b.StopTimer()
			stop()
		})
	}
}

// BenchmarkPrebuiltIndexRead: reading the factory's index of 2,000 images
// at start (the file read and decoded, its checksum included) against the
// checksum alone (sha256 of the same bytes): the share of the read the
// checksum costs.
func BenchmarkPrebuiltIndexRead(b *testing.B) {
	dir := manyImages(b, 2000)
	writePrebuilt(b, dir)
	path := filepath.Join(dir, regindex.FileName)
	data := must(os.ReadFile(path))
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; i < b.N; i++ {
			must(readPrebuilt(path))
		}
	})
	b.Run("sha256", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; i < b.N; i++ {
			sha256.Sum256(data)
		}
	})
	b.Run("crc32c", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		tab := crc32.MakeTable(crc32.Castagnoli)
		for i := 0; i < b.N; i++ {
			crc32.Checksum(data, tab)
		}
	})
}
