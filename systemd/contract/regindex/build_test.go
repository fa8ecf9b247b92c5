package regindex

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestBuild: the walk's rules, as the factory's index records them. A
// named image is indexed under its full name (a Docker Hub short name
// normalised), an entry with a bare tag is skipped with a warning, an
// unnamed one is indexed but not named, an index missing one platform's
// manifest keeps the other; a layout missing a blob gives no index.
func TestBuild(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img := func() v1.Image {
		i, err := random.Image(64, 2)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	named := func(ref string) layout.Option {
		return layout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: ref})
	}
	app, bare, unnamed, amd, arm := img(), img(), img(), img(), img()
	multi := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: amd}, mutate.IndexAddendum{Add: arm})
	for _, add := range []error{
		p.AppendImage(app, named("quay.io/acme/app:1.2")),
		p.AppendImage(bare, named("latest")),
		p.AppendImage(unnamed),
		p.AppendIndex(multi, named("busybox:1.36")),
	} {
		if add != nil {
			t.Fatal(add)
		}
	}
	armDigest, _ := arm.Digest()
	if err := os.Remove(filepath.Join(dir, "blobs", "sha256", armDigest.Hex)); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	ix, err := Build(dir, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	digestOf := func(d interface{ Digest() (v1.Hash, error) }) string {
		h, err := d.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return h.String()
	}
	want := []struct{ repo, tag, digest string }{
		{"quay.io/acme/app", "1.2", digestOf(app)},
		{"docker.io/library/busybox", "1.36", digestOf(multi)},
	}
	if len(ix.Images) != len(want) {
		t.Fatalf("%d images named, want %d: %+v", len(ix.Images), len(want), ix.Images)
	}
	for i, w := range want {
		im := ix.Images[i]
		if got := ix.BlobDigest(ix.Manifests[im.Manifest].Blob); im.Repository != w.repo || im.Tag != w.tag || got != w.digest {
			t.Errorf("image %d: %s:%s → %s, want %s:%s → %s", i, im.Repository, im.Tag, got, w.repo, w.tag, w.digest)
		}
	}
	// app, bare, unnamed, the index and its amd64 manifest: the missing
	// arm64 one is left out, and the index names only amd64.
	if len(ix.Manifests) != 5 {
		t.Errorf("%d manifests, want 5", len(ix.Manifests))
	}
	for _, m := range ix.Manifests {
		if ix.BlobDigest(m.Blob) == digestOf(multi) {
			if len(m.Children) != 1 || ix.BlobDigest(ix.Manifests[m.Children[0]].Blob) != digestOf(amd) {
				t.Errorf("the index's children %v, want amd64's manifest only", m.Children)
			}
		}
	}
	for _, line := range []string{"skipping index entry: ref.name is not a full image reference", "index references a manifest not in the layout"} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("no warning %q in:\n%s", line, logs.String())
		}
	}

	// A layer gone: no index.
	layers, err := app.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "blobs", "sha256", digestOf(layers[0])[len("sha256:"):])); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(dir, slog.New(slog.NewTextHandler(&logs, nil))); err == nil || !strings.Contains(err.Error(), "1 blobs missing") {
		t.Errorf("a layer missing: %v, want an error counting it", err)
	}
}
