package gate

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"

	kilnregistry "github.com/kiln-appliance/kiln/systemd/agent/registry"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// kilnPartition is an image partition as the builder lays it out, holding
// quay.io/acme/app:1.2, with its kiln.json naming the registry at addr.
func kilnPartition(t *testing.T, addr string) (string, *contract.Contents) {
	t.Helper()
	part := t.TempDir()
	img, err := random.Image(2048, 2)
	if err != nil {
		t.Fatal(err)
	}
	p, err := layout.Write(filepath.Join(part, contract.OCIDir), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": "quay.io/acme/app:1.2"})); err != nil {
		t.Fatal(err)
	}
	c := contents(t, addr, img, true)
	c.SchemaVersion = contract.ContentsVersion
	f, err := os.Create(filepath.Join(part, contract.ContentsFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Encode(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return part, c
}

// The two halves fit: kiln's own registry, serving a partition laid out as
// the builder lays it out, satisfies the gate's content check (namespacing by
// host, HEAD by digest with Docker-Content-Digest).
func TestGateOpensOnKilnRegistry(t *testing.T) {
	addr := freeAddr(t)
	part, c := kilnPartition(t, addr)

	srv, err := kilnregistry.New([]string{part}, kilnregistry.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, addr, srv)
	g := newGate(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := g.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("gate opened on kiln's registry in %s", time.Since(start))
	if _, err := os.Stat(g.DropIn); err != nil {
		t.Fatal(err)
	}
}

// TestGateWaitsForTryingRelease: at an upgrade boot the gate opens only
// once kiln's registry serves the release being tried (its image from a
// host the partition has none from, blobs in the release store), and the
// drop-in mirrors that host. A registry serving the partition only (no
// --state) does not open it.
func TestGateWaitsForTryingRelease(t *testing.T) {
	addr := freeAddr(t)
	part, c := kilnPartition(t, addr)
	store := t.TempDir()

	// 1.3's image, written into the release store as the import writes it.
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := layout.Write(store, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.WriteImage(img); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(store, "blobs", "sha256"))
	next := contract.Release{Version: "1.3.0", Images: []contract.Image{{Name: "ghcr.io/acme/new:1.3",
		Digest: digestString(t, img), MediaType: "application/vnd.docker.distribution.manifest.v2+json", Served: true}}}
	for _, e := range ents {
		next.Blobs = append(next.Blobs, "sha256:"+e.Name())
	}
	st := &state.State{SchemaVersion: state.Version, Current: contract.Release{Version: "1.2.0", Images: c.Images}, Trying: &next}
	stateFile := filepath.Join(t.TempDir(), "state.json")
	data, _ := state.Encode(st)
	os.WriteFile(stateFile, data, 0o644)

	quiet := kilnregistry.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Run("partition only", func(t *testing.T) {
		srv, err := kilnregistry.New([]string{part}, quiet)
		if err != nil {
			t.Fatal(err)
		}
		a := freeAddr(t)
		serve(t, a, srv)
		cc := *c
		cc.Registry.Listen = a
		g := newGate(t, &cc)
		if err := g.AddState(st); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := g.Open(ctx); err == nil || !strings.Contains(err.Error(), "ghcr.io/acme/new@"+next.Images[0].Digest) {
			t.Fatalf("gate opened on a registry without the release being tried, or said something else: %v", err)
		}
		if _, err := os.Stat(g.DropIn); !os.IsNotExist(err) {
			t.Errorf("drop-in written: %v", err)
		}
	})
	t.Run("with the state", func(t *testing.T) {
		srv, err := kilnregistry.New([]string{part}, quiet, kilnregistry.WithReleaseState(stateFile, store))
		if err != nil {
			t.Fatal(err)
		}
		serve(t, addr, srv)
		g := newGate(t, c)
		if err := g.AddState(st); err != nil {
			t.Fatal(err)
		}
		if len(g.Images) != 2 || strings.Join(g.Upstreams, ",") != "ghcr.io,quay.io" {
			t.Fatalf("gate waits for %v, mirrors %v; want the partition's image and 1.3's, hosts ghcr.io,quay.io", g.Images, g.Upstreams)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Open(ctx); err != nil {
			t.Fatal(err)
		}
		drop, err := os.ReadFile(g.DropIn)
		if err != nil || !strings.Contains(string(drop), `location = "`+addr+`/ghcr.io"`) {
			t.Errorf("drop-in does not mirror ghcr.io (%v):\n%s", err, drop)
		}
	})
}

func digestString(t *testing.T, img interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
