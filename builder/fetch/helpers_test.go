package fetch

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

var (
	amd64 = images.Platform("amd64")
	arm64 = images.Platform("arm64")
)

// testRegistry is go-containerregistry's in-memory registry on loopback,
// counting the requests it serves.
type testRegistry struct {
	host     string
	requests atomic.Int64
	blobGets atomic.Int64
	// wrap, if set, sees every request before the registry.
	wrap func(w http.ResponseWriter, r *http.Request, next http.Handler)
}

func newRegistry(t *testing.T) *testRegistry {
	t.Helper()
	reg := &testRegistry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reg.requests.Add(1)
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
			reg.blobGets.Add(1)
		}
		if reg.wrap != nil {
			reg.wrap(w, r, h)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	reg.host = strings.TrimPrefix(srv.URL, "http://")
	return reg
}

// push writes an image or index to the registry as repo:tag.
func (reg *testRegistry) push(t testing.TB, repoTag string, x any, opts ...remote.Option) {
	t.Helper()
	ref, err := name.ParseReference(reg.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	switch x := x.(type) {
	case v1.Image:
		err = remote.Write(ref, x, opts...)
	case v1.ImageIndex:
		err = remote.WriteIndex(ref, x, opts...)
	}
	if err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func (reg *testRegistry) resetCounts() {
	reg.requests.Store(0)
	reg.blobGets.Store(0)
}

// fixture is the hello image in every source form.
type fixture struct {
	reg      *testRegistry
	ociDir   string        // quay.io/kiln/hello:1.0 (amd64), quay.io/kiln/hello:multi, and :split (two entries)
	archive  string        // docker archive, quay.io/kiln/hello:1.0
	single   string        // manifest digest of hello:1.0
	index    string        // index digest of hello:multi
	amd, arm string        // its manifests
	archived string        // manifest digest of the archived image
	img      v1.Image      // hello:1.0, as in the layout
	idx      v1.ImageIndex // hello:multi, as in the layout
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{reg: newRegistry(t), ociDir: filepath.Join(dir, "oci"), archive: filepath.Join(dir, "hello.tar")}
	var err error
	if f.single, err = images.HelloImage(f.ociDir, "quay.io/kiln/hello:1.0"); err != nil {
		t.Fatal(err)
	}
	if f.index, err = images.HelloImage(f.ociDir, "quay.io/kiln/hello:multi", "amd64", "arm64"); err != nil {
		t.Fatal(err)
	}
	if f.archived, err = images.HelloArchive(f.archive, "quay.io/kiln/hello:1.0", "amd64"); err != nil {
		t.Fatal(err)
	}
	// The registry serves what the layout holds.
	p, err := layout.FromPath(f.ociDir)
	if err != nil {
		t.Fatal(err)
	}
	if f.img, err = p.Image(mustHash(t, f.single)); err != nil {
		t.Fatal(err)
	}
	if f.idx, err = p.ImageIndex(); err == nil {
		f.idx, err = f.idx.ImageIndex(mustHash(t, f.index))
	}
	if err != nil {
		t.Fatal(err)
	}
	im, err := f.idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	f.amd, f.arm = im.Manifests[0].Digest.String(), im.Manifests[1].Digest.String()
	// The same name twice, one entry per platform, as `crane pull --platform` writes.
	for _, d := range im.Manifests {
		img, err := f.idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		ann := layout.WithAnnotations(map[string]string{images.RefNameAnnotation: "quay.io/kiln/hello:split"})
		if err := p.AppendImage(img, ann, layout.WithPlatform(*d.Platform)); err != nil {
			t.Fatal(err)
		}
	}
	f.reg.push(t, "kiln/hello:1.0", f.img)
	f.reg.push(t, "kiln/hello:multi", f.idx)
	f.reg.resetCounts()
	return f
}

// sizeOf is manifest + config + layers of an image, by go-containerregistry.
func sizeOf(t *testing.T, img v1.Image) int64 {
	t.Helper()
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n
}

// checkCached verifies that every blob of img is in c, intact.
func checkCached(t *testing.T, c *Cache, img *Image) {
	t.Helper()
	for _, d := range append([]v1.Descriptor{img.Descriptor}, img.Blobs()...) {
		if err := c.Verify(d.Digest); err != nil {
			t.Errorf("%s: %v", img.Source, err)
		}
	}
}

// tempFiles lists files in the cache that are not named by their digest.
func tempFiles(t *testing.T, c *Cache) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(c.Dir(), "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// pushLayout pushes every image named in an OCI layout to the registry under
// its ref's repository path (host replaced).
func pushLayout(t testing.TB, reg *testRegistry, dir string, refs []string) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	ii, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range refs {
		for _, d := range im.Manifests {
			if d.Annotations[images.RefNameAnnotation] != ref {
				continue
			}
			img, err := p.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			_, repoTag, _ := strings.Cut(ref, "/")
			reg.push(t, repoTag, img)
		}
	}
}

// cancelReporter cancels a context once a task has seen some bytes.
type cancelReporter struct{ cancel context.CancelFunc }

func (r cancelReporter) Task(string, int64) progress.Task { return cancelTask(r) }

type cancelTask struct{ cancel context.CancelFunc }

func (t cancelTask) Write(p []byte) (int, error) {
	if len(p) > 0 {
		t.cancel()
	}
	return len(p), nil
}
func (t cancelTask) Done(error) {}

// basicAuth makes the registry demand user kiln, password secret.
func basicAuth(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if u, p, ok := r.BasicAuth(); !ok || u != "kiln" || p != "secret" {
		w.Header().Set("WWW-Authenticate", `Basic realm="kiln test"`)
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
		return
	}
	next.ServeHTTP(w, r)
}

var testCreds = remote.WithAuth(&authn.Basic{Username: "kiln", Password: "secret"})
