package fetch

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// TestFetchCached: a second fetch of the same images, as a rebuild does,
// reads nothing from the source.
func TestFetchCached(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name, source, digest string
		platform             v1.Platform
		gone                 func() // makes the source unreadable before the second fetch
	}{
		{"docker", "docker://" + f.reg.host + "/kiln/hello:1.0", f.single, amd64, nil},
		{"docker index", "docker://" + f.reg.host + "/kiln/hello:multi", f.index, arm64, nil},
		{"oci", "oci:" + f.ociDir + ":multi", f.amd, amd64, func() { os.RemoveAll(f.ociDir) }},
		{"docker-archive", "docker-archive:" + f.archive, f.archived, amd64, func() { os.Remove(f.archive) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			f.reg.resetCounts()
			first, err := c.Fetch(context.Background(), tc.source, "", tc.digest, tc.platform, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkCached(t, c, first)
			if tc.gone == nil && f.reg.blobGets.Load() != int64(len(first.Blobs())) {
				t.Errorf("first fetch: %d blob requests for %d blobs", f.reg.blobGets.Load(), len(first.Blobs()))
			}
			if tc.gone != nil {
				tc.gone()
			}
			f.reg.resetCounts()
			second, err := c.Fetch(context.Background(), tc.source, "", tc.digest, tc.platform, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n := f.reg.requests.Load(); n != 0 {
				t.Errorf("second fetch made %d registry requests, want 0", n)
			}
			if !bytes.Equal(first.Manifest, second.Manifest) || first.Descriptor.Digest != second.Descriptor.Digest {
				t.Errorf("second fetch returned another manifest")
			}
		})
	}
}

// corruptBlobs serves every blob GET with its last byte flipped: right
// length, wrong content.
func corruptBlobs(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/sha256:") {
		next.ServeHTTP(w, r)
		return
	}
	rec := &bufferedResponse{header: http.Header{}}
	next.ServeHTTP(rec, r)
	if b := rec.body.Bytes(); len(b) > 0 {
		b[len(b)-1] ^= 0xff
	}
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.code)
	w.Write(rec.body.Bytes())
}

// corruptManifests serves manifests with a space added: valid JSON, wrong
// digest.
func corruptManifests(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/manifests/") {
		next.ServeHTTP(w, r)
		return
	}
	rec := &bufferedResponse{header: http.Header{}}
	next.ServeHTTP(rec, r)
	body := append(rec.body.Bytes(), ' ')
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(rec.code)
	w.Write(body)
}

type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header         { return b.header }
func (b *bufferedResponse) WriteHeader(code int)        { b.code = code }
func (b *bufferedResponse) Write(p []byte) (int, error) { return b.body.Write(p) }

func TestFetchCorrupt(t *testing.T) {
	f := newFixture(t)
	bad := newRegistry(t)
	bad.push(t, "kiln/hello:1.0", f.img)
	bad.wrap = corruptBlobs

	badManifestReg := newRegistry(t)
	badManifestReg.push(t, "kiln/hello:1.0", f.img)
	badManifestReg.wrap = corruptManifests

	_, _, layers, err := images.Blobs(f.ociDir, "quay.io/kiln/hello:1.0")
	if err != nil {
		t.Fatal(err)
	}
	tampered := filepath.Join(t.TempDir(), "tampered")
	if _, err := images.HelloImage(tampered, "quay.io/kiln/hello:1.0"); err != nil {
		t.Fatal(err)
	}
	if err := images.CorruptBlob(tampered, layers[0]); err != nil {
		t.Fatal(err)
	}
	badManifest := filepath.Join(t.TempDir(), "badmanifest")
	if _, err := images.HelloImage(badManifest, "quay.io/kiln/hello:1.0"); err != nil {
		t.Fatal(err)
	}
	if err := images.CorruptBlob(badManifest, f.single); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, source string
		says         []string
	}{
		{"registry serves wrong bytes", "docker://" + bad.host + "/kiln/hello:1.0", []string{bad.host + "/kiln/hello:1.0", "expected sha256:", "got sha256:"}},
		{"registry serves wrong manifest", "docker://" + badManifestReg.host + "/kiln/hello:1.0", []string{badManifestReg.host, "does not match"}},
		{"tampered oci layer", "oci:" + tampered + ":1.0", []string{tampered, layers[0], "expected " + layers[0], "got sha256:"}},
		{"tampered oci manifest", "oci:" + badManifest + ":1.0", []string{badManifest, "manifest " + f.single, "got sha256:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Fetch(context.Background(), tc.source, "", f.single, amd64, nil)
			t.Log(err)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q", s)
				}
			}
			// Nothing damaged is cached: neither the bad blob nor a temp file.
			if n := tempFiles(t, c); len(n) > 0 {
				t.Errorf("temp files left: %v", n)
			}
			for _, l := range layers {
				if _, err := os.Stat(c.Path(mustHash(t, l))); err == nil {
					t.Errorf("corrupt layer %s was cached", l)
				}
			}
			if _, err := Resolve(context.Background(), tc.source, "", amd64); tc.name == "tampered oci manifest" && !errors.Is(err, ErrCorrupt) {
				t.Errorf("Resolve of a tampered manifest: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestFetchAllShared fetches images that share layers, twice at once into
// one cache directory (two builds on one host): each blob is requested once
// per Cache, and every cached blob is intact.
func TestFetchAllShared(t *testing.T) {
	dir := t.TempDir()
	imgs, err := images.RandomImages(dir, 6, 24<<20, 0.5, 42)
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t)
	var refs []string
	for _, img := range imgs {
		refs = append(refs, img.Ref)
	}
	pushLayout(t, reg, dir, refs)
	var reqs []Request
	for _, img := range imgs {
		_, repoTag, _ := strings.Cut(img.Ref, "/")
		reqs = append(reqs, Request{Source: "docker://" + reg.host + "/" + repoTag, Digest: img.Digest, Platform: amd64})
	}
	reg.resetCounts()

	cacheDir := t.TempDir()
	var wg sync.WaitGroup
	results := make([][]*Image, 2)
	errs := make([]error, 2)
	for i := range results {
		c, err := Open(cacheDir)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.FetchAll(context.Background(), reqs, nil)
		}()
	}
	wg.Wait()
	c, _ := Open(cacheDir)
	distinct := map[v1.Hash]bool{}
	for i, res := range results {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		for j, img := range res {
			if img.Descriptor.Digest.String() != imgs[j].Digest {
				t.Errorf("image %d: got %s, want %s", j, img.Descriptor.Digest, imgs[j].Digest)
			}
			checkCached(t, c, img)
			for _, d := range img.Blobs() {
				distinct[d.Digest] = true
			}
		}
	}
	// Two Caches, each fetching every distinct blob at most once.
	if n := reg.blobGets.Load(); n > int64(2*len(distinct)) || n < int64(len(distinct)) {
		t.Errorf("%d blob requests for %d distinct blobs fetched by two caches", n, len(distinct))
	}
	if n := tempFiles(t, c); len(n) > 0 {
		t.Errorf("temp files left: %v", n)
	}

	// One Cache: shared layers are fetched once.
	reg.resetCounts()
	one, _ := Open(t.TempDir())
	if _, err := one.FetchAll(context.Background(), reqs, nil); err != nil {
		t.Fatal(err)
	}
	if n := reg.blobGets.Load(); n != int64(len(distinct)) {
		t.Errorf("one cache: %d blob requests for %d distinct blobs", n, len(distinct))
	}
}

// TestFetchCancel cancels a fetch while a layer streams: the error says so
// and the cache holds no partial blob.
func TestFetchCancel(t *testing.T) {
	dir := t.TempDir()
	imgs, err := images.RandomImages(dir, 1, 8<<20, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t)
	pushLayout(t, reg, dir, []string{imgs[0].Ref})
	// Serve the first MiB of each layer, then stall until the client leaves.
	reg.wrap = stallAfter(1 << 20)
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c.stall = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, repoTag, _ := strings.Cut(imgs[0].Ref, "/")
	_, err = c.Fetch(ctx, "docker://"+reg.host+"/"+repoTag, "", imgs[0].Digest, amd64, cancelReporter{cancel})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if n := tempFiles(t, c); len(n) > 0 {
		t.Errorf("temp files left: %v", n)
	}
	_, _, layers, err := images.Blobs(dir, imgs[0].Ref)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		if _, err := os.Stat(c.Path(mustHash(t, l))); err == nil {
			t.Errorf("layer %s cached after cancel", l)
		}
	}
}

// TestFetchStall: a registry that stops sending mid-layer is given up on
// with an error that says so, and leaves nothing in the cache.
func TestFetchStall(t *testing.T) {
	dir := t.TempDir()
	imgs, err := images.RandomImages(dir, 1, 4<<20, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t)
	pushLayout(t, reg, dir, []string{imgs[0].Ref})
	reg.wrap = stallAfter(1 << 20)
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c.stall = 300 * time.Millisecond
	_, repoTag, _ := strings.Cut(imgs[0].Ref, "/")
	start := time.Now()
	_, err = c.Fetch(context.Background(), "docker://"+reg.host+"/"+repoTag, "", imgs[0].Digest, amd64, nil)
	t.Log(err)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "no data for") {
		t.Fatalf("err = %v, want ErrUnreachable saying no data", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %v", d)
	}
	if n := tempFiles(t, c); len(n) > 0 {
		t.Errorf("temp files left: %v", n)
	}
}

// stallAfter serves the first n bytes of each blob bigger than n, then
// nothing until the client leaves.
func stallAfter(n int) func(w http.ResponseWriter, r *http.Request, next http.Handler) {
	return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/sha256:") {
			next.ServeHTTP(w, r)
			return
		}
		rec := &bufferedResponse{header: http.Header{}}
		next.ServeHTTP(rec, r)
		if rec.body.Len() <= n {
			w.Write(rec.body.Bytes())
			return
		}
		w.Header().Set("Content-Length", rec.header.Get("Content-Length"))
		w.Write(rec.body.Bytes()[:n])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
}

// TestFetchProgress: bytes reported add up to what was fetched.
func TestFetchProgress(t *testing.T) {
	f := newFixture(t)
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rep := &countReporter{}
	img, err := c.Fetch(context.Background(), "oci:"+f.ociDir+":1.0", "", f.single, amd64, rep)
	if err != nil {
		t.Fatal(err)
	}
	want := img.Config.Size + sumSizes(img.Layers)
	if rep.total != want || rep.written != want || rep.done != 1 {
		t.Errorf("reported total %d, written %d, done %d; want %d, %d, 1", rep.total, rep.written, rep.done, want, want)
	}
}

type countReporter struct {
	mu                   sync.Mutex
	total, written, done int64
}

func (r *countReporter) Task(_ string, total int64) progress.Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total += total
	return countTask{r}
}

type countTask struct{ r *countReporter }

func (t countTask) Write(p []byte) (int, error) {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	t.r.written += int64(len(p))
	return len(p), nil
}

func (t countTask) Done(error) {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	t.r.done++
}

// TestFetchStreams: fetching 64 MiB of layers allocates a small fraction of
// that; blobs are never held in memory.
func TestFetchStreams(t *testing.T) {
	dir := t.TempDir()
	imgs, err := images.RandomImages(dir, 1, 64<<20, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := c.Fetch(context.Background(), "oci:"+dir, "", imgs[0].Digest, amd64, nil); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 8<<20 {
		t.Errorf("fetching 64 MiB allocated %d MiB", n>>20)
	} else {
		t.Logf("fetching 64 MiB allocated %d KiB", n>>10)
	}
}

// TestFetchAllProgressShared: each image's task ends at the total it
// started with, though a layer it shares with another image was fetched
// (and counted) by that image's task.
func TestFetchAllProgressShared(t *testing.T) {
	dir := t.TempDir()
	imgs, err := images.RandomImages(dir, 4, 4<<20, 0.5, 7)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []Request
	for _, img := range imgs {
		reqs = append(reqs, Request{Source: "oci:" + dir + ":" + img.Ref, Digest: img.Digest, Platform: amd64})
	}
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rep := &taskReporter{}
	if _, err := c.FetchAll(context.Background(), reqs, rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.tasks) != len(imgs) {
		t.Fatalf("%d tasks for %d images", len(rep.tasks), len(imgs))
	}
	for _, task := range rep.tasks {
		if task.written != task.total || !task.done {
			t.Errorf("%s: %d bytes of %d, done %v: want all of its total, done", task.name, task.written, task.total, task.done)
		}
	}
}

// taskReporter records each task's total and the bytes counted on it.
type taskReporter struct {
	mu    sync.Mutex
	tasks []*recordedTask
}

type recordedTask struct {
	mu             sync.Mutex
	name           string
	total, written int64
	done           bool
}

func (r *taskReporter) Task(name string, total int64) progress.Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &recordedTask{name: name, total: total}
	r.tasks = append(r.tasks, t)
	return t
}

func (t *recordedTask) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.written += int64(len(p))
	return len(p), nil
}

func (t *recordedTask) Done(error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
}
