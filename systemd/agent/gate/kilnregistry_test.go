package gate

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"

	kilnregistry "github.com/kiln-appliance/kiln/systemd/agent/registry"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// The two halves fit: kiln's own registry, serving a partition laid out as
// the builder lays it out, satisfies the gate's content check (namespacing by
// host, HEAD by digest with Docker-Content-Digest).
func TestGateOpensOnKilnRegistry(t *testing.T) {
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
	addr := freeAddr(t)
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
