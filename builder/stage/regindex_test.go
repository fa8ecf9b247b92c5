package stage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// TestWriteRegistryIndex: the staged layout gets the node registry's index,
// naming every image by the reference it was staged under; a layout with a
// missing blob gets none (the build fails) and nothing half written.
func TestWriteRegistryIndex(t *testing.T) {
	cache := t.TempDir()
	var imgs []Image
	for _, ref := range []string{"quay.io/acme/app:1.2", "registry.example:5000/team/tool:v3"} {
		img, err := random.Image(256, 2)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, cacheImage(t, cache, ref, img))
	}
	src := func(h v1.Hash) string { return filepath.Join(cache, h.Hex) }
	dir := filepath.Join(t.TempDir(), "oci")
	if err := WriteLayout(dir, src, imgs); err != nil {
		t.Fatal(err)
	}
	if err := WriteRegistryIndex(dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, regindex.FileName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := regindex.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("%s mode %v, want 0644 (the node's registry runs unprivileged)", path, fi.Mode().Perm())
	}
	if ix.BlobCount() != 2*4 || len(ix.Manifests) != 2 || len(ix.Images) != 2 {
		t.Fatalf("%d blobs, %d manifests, %d images; want 8, 2, 2", ix.BlobCount(), len(ix.Manifests), len(ix.Images))
	}
	for i, want := range []struct{ repo, tag, digest string }{
		{"quay.io/acme/app", "1.2", imgs[0].Manifest.Digest.String()},
		{"registry.example:5000/team/tool", "v3", imgs[1].Manifest.Digest.String()},
	} {
		im := ix.Images[i]
		if got := ix.BlobDigest(ix.Manifests[im.Manifest].Blob); im.Repository != want.repo || im.Tag != want.tag || got != want.digest {
			t.Errorf("image %d: %s:%s → %s, want %s:%s → %s", i, im.Repository, im.Tag, got, want.repo, want.tag, want.digest)
		}
	}

	// A blob gone from the layout: no index, no temp file.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "blobs", "sha256", imgs[1].Blobs[1].Hex)); err != nil {
		t.Fatal(err)
	}
	err = WriteRegistryIndex(dir)
	if err == nil || !strings.Contains(err.Error(), "1 blobs missing") {
		t.Errorf("damaged layout: %v, want an error counting the missing blob", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), "registry-index") {
			t.Errorf("%s left in the layout after a failed index", e.Name())
		}
	}
}
