package registry

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// fixture is an OCI layout built by the tests:
//
//	quay.io/acme/app:1.2          OCI image (linux/amd64), 2 tar+gzip layers
//	quay.io/acme/app:latest       same digest
//	quay.io/acme/multi:1.0        OCI index: linux/amd64 + linux/arm64
//	quay.io/acme/pinned@sha256:…  an image named by digest only
//	busybox:1.36                  Docker schema 2 image (→ docker.io/library/busybox)
//	latest                        a bare tag: skipped with a warning
//	(unnamed)                     two referrers of app: an SBOM and a signature
type fixture struct {
	dir                         string
	app, multiAMD, pinned, busy v1.Image
	multi                       v1.ImageIndex
	sbom, sig                   v1.Image
	appDigest, multiDigest      v1.Hash
	sbomDigest, sigDigest       v1.Hash
	pinnedDigest, bareTagDigest v1.Hash
}

const (
	sbomType = "application/vnd.example.sbom.v1+json"
	sigType  = "application/vnd.example.sig.v1"
)

// ociImage is a random OCI image for platform with n tar+gzip layers.
func ociImage(t testing.TB, arch string, n int, size int64) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for i := 0; i < n; i++ {
		l, err := random.Layer(size, types.OCILayer)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	return withPlatform(t, img, arch)
}

func withPlatform(t testing.TB, img v1.Image, arch string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// artifact is an OCI artifact manifest (image manifest with artifact config
// media type) whose subject is img.
func artifact(t testing.TB, subject v1.Image, artifactType string) v1.Image {
	t.Helper()
	a := mutate.ConfigMediaType(ociImage(t, "amd64", 1, 64), types.MediaType(artifactType))
	d, err := descriptorOf(subject)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.Subject(a, *d).(v1.Image)
}

func descriptorOf(img v1.Image) (*v1.Descriptor, error) {
	mt, err := img.MediaType()
	if err != nil {
		return nil, err
	}
	d, err := img.Digest()
	if err != nil {
		return nil, err
	}
	sz, err := img.Size()
	if err != nil {
		return nil, err
	}
	return &v1.Descriptor{MediaType: mt, Digest: d, Size: sz}, nil
}

func refName(n string) layout.Option {
	return layout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: n})
}

// must unwraps a fixture-building call; fixtures cannot fail short of a bug.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{dir: filepath.Join(t.TempDir(), "oci")}
	p := must(layout.Write(f.dir, empty.Index))
	f.app = ociImage(t, "amd64", 2, 4096)
	f.appDigest = must(f.app.Digest())
	f.multiAMD = ociImage(t, "amd64", 1, 2048)
	arm := ociImage(t, "arm64", 1, 2048)
	f.multi = mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: f.multiAMD, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	), types.OCIImageIndex)
	f.multiDigest = must(f.multi.Digest())
	f.pinned = ociImage(t, "amd64", 1, 512)
	f.pinnedDigest = must(f.pinned.Digest())
	f.busy = withPlatform(t, must(random.Image(1024, 1)), "amd64")
	bare := ociImage(t, "amd64", 1, 128)
	f.bareTagDigest = must(bare.Digest())
	f.sbom = artifact(t, f.app, sbomType)
	f.sig = artifact(t, f.app, sigType)
	f.sbomDigest = must(f.sbom.Digest())
	f.sigDigest = must(f.sig.Digest())

	for _, a := range []struct {
		img  v1.Image
		opts []layout.Option
	}{
		{f.app, []layout.Option{refName("quay.io/acme/app:1.2")}},
		{f.app, []layout.Option{refName("quay.io/acme/app:latest")}},
		{f.pinned, []layout.Option{refName("quay.io/acme/pinned@" + f.pinnedDigest.String())}},
		{f.busy, []layout.Option{refName("busybox:1.36")}},
		{bare, []layout.Option{refName("latest")}},
		{f.sbom, nil},
		{f.sig, nil},
	} {
		if err := p.AppendImage(a.img, a.opts...); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.AppendIndex(f.multi, refName("quay.io/acme/multi:1.0")); err != nil {
		t.Fatal(err)
	}
	return f
}

// blobPath is where the layout keeps blob h.
func (f *fixture) blobPath(h v1.Hash) string {
	return filepath.Join(f.dir, "blobs", h.Algorithm, h.Hex)
}

// syncBuffer is a goroutine-safe log sink for checking log lines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testLogger returns a logger writing into the returned buffer.
func testLogger() (*slog.Logger, *syncBuffer) {
	var buf syncBuffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

// serve starts s on a loopback port and returns its host:port. The server
// stops when the test ends.
func serve(t testing.TB, s *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return l.Addr().String()
}

// get fetches url with method and headers, returning the response and its body.
func get(t testing.TB, method, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}
