package gate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// serve runs a real registry (go-containerregistry's) on addr until the test ends.
func serve(t testing.TB, addr string, handler http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// push puts a random image into the registry at addr under quay.io/acme/app:1.2,
// namespaced by upstream host as kiln's registry serves it.
func push(t *testing.T, addr string) v1.Image {
	t.Helper()
	img, err := random.Image(2048, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(addr+"/quay.io/acme/app:1.2", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return img
}

// contents is the kiln.json a partition holding img would carry.
func contents(t *testing.T, addr string, img v1.Image, mirrorTags bool) *contract.Contents {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	mt, err := img.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	return &contract.Contents{
		Registry: contract.Registry{Listen: addr, MirrorTags: mirrorTags},
		Images: []contract.Image{
			{Name: "quay.io/acme/app:1.2", Digest: d.String(), MediaType: string(mt), Served: true},
			{Name: "docker.io/library/preloaded-only:1", Digest: "sha256:" + strings.Repeat("0", 64), Served: false},
		},
	}
}

func newGate(t *testing.T, c *contract.Contents) *Gate {
	t.Helper()
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	g.DropIn = filepath.Join(t.TempDir(), "registries.conf.d", "50-kiln-mirror.conf")
	g.Interval = 100 * time.Millisecond
	g.Log = testWriter{t}
	return g
}

// logWatch is a gate log that tests can wait on: it proves the gate made
// the attempt a test means to observe, instead of sleeping a fixed window.
type logWatch struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func newLogWatch(t *testing.T) *logWatch { return &logWatch{t: t, added: make(chan struct{}, 1)} }

func (l *logWatch) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	l.mu.Lock()
	l.lines = append(l.lines, string(p))
	l.mu.Unlock()
	select {
	case l.added <- struct{}{}:
	default:
	}
	return len(p), nil
}

// waitFor returns once a logged line contains s, failing after 20 s.
func (l *logWatch) waitFor(s string) {
	l.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		l.mu.Lock()
		for _, line := range l.lines {
			if strings.Contains(line, s) {
				l.mu.Unlock()
				return
			}
		}
		l.mu.Unlock()
		select {
		case <-l.added:
		case <-deadline:
			l.t.Fatalf("the gate never logged %q", s)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestOpenWritesAfterContentServed(t *testing.T) {
	addr := serve(t, "127.0.0.1:0", registry.New(registry.Logger(nopLogger())))
	img := push(t, addr)
	g := newGate(t, contents(t, addr, img, true))
	if got := g.Upstreams; fmt.Sprint(got) != "[quay.io]" {
		t.Fatalf("upstreams %v: only hosts of served images are mirrored", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Open(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(g.DropIn)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`[[registry]]
prefix = "quay.io"
location = "quay.io"

[[registry.mirror]]
location = "%s/quay.io"
insecure = true
pull-from-mirror = "all"
`, addr)
	if !strings.HasSuffix(string(got), want) {
		t.Errorf("drop-in:\n%s\nwant it to end with:\n%s", got, want)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.DropIn); !os.IsNotExist(err) {
		t.Errorf("drop-in still there after Close: %v", err)
	}
}

// The registry comes up late, and answers /v2/ before its content is there:
// the gate keeps waiting through both and opens only when the manifest is served.
func TestOpenWaitsForLateRegistry(t *testing.T) {
	addr := freeAddr(t)
	img, err := random.Image(2048, 2)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, contents(t, addr, img, false))
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	log := newLogWatch(t)
	g.Log = log
	go func() { done <- g.Open(ctx) }()

	log.waitFor("no registry answers")
	serve(t, addr, registry.New(registry.Logger(nopLogger())))
	log.waitFor("does not serve") // up, but empty: the gate has seen it and keeps waiting
	if _, err := os.Stat(g.DropIn); !os.IsNotExist(err) {
		t.Fatalf("drop-in written before the content was served: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("gate returned before the content was served: %v", err)
	default:
	}
	ref, _ := name.ParseReference(addr+"/quay.io/acme/app:1.2", name.Insecure)
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(g.DropIn)
	if err != nil || !bytes.Contains(got, []byte(`pull-from-mirror = "digest-only"`)) {
		t.Fatalf("drop-in %q (%v): want digest-only when tags are not mirrored", got, err)
	}
}

// What answers on the port is not enough: the wrong thing times out with a
// clear error, and no drop-in is written.
func TestOpenRefusesWrongRegistry(t *testing.T) {
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		handler http.Handler // nil: nothing listens
		want    string
	}{
		{"nothing listening", nil, "no registry answers"},
		{"empty registry (Zarf)", registry.New(registry.Logger(nopLogger())), "answers but does not serve quay.io/acme/app@sha256:"},
		{"not a registry", http.NotFoundHandler(), "answered 404 Not Found, want 200 OK"},
		{"wrong digest header", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Docker-Content-Digest", "sha256:"+strings.Repeat("e", 64))
		}), "not this partition's content"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := freeAddr(t)
			if tt.handler != nil {
				serve(t, addr, tt.handler)
			}
			g := newGate(t, contents(t, addr, img, true))
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := g.Open(ctx)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "NOT pointed at it") {
				t.Fatalf("Open error = %v\nwant one containing %q", err, tt.want)
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Errorf("timeout not bounded: took %s", d)
			}
			if _, err := os.Stat(g.DropIn); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("drop-in written although the gate failed: %v", err)
			}
		})
	}
}
