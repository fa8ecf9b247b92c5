package stage

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// cacheImage writes img's manifest, config and layers into a flat blob dir,
// the way the fetch cache stores them, and returns the stage.Image for it.
func cacheImage(t *testing.T, cache, ref string, img v1.Image) Image {
	t.Helper()
	put := func(h v1.Hash, r io.Reader) {
		f, err := os.OpenFile(filepath.Join(cache, h.Hex), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600) // as a private cache might
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := img.RawManifest()
	digest, _ := img.Digest()
	mt, _ := img.MediaType()
	put(digest, bytesReader(raw))
	cfgName, _ := img.ConfigName()
	cfg, _ := img.RawConfigFile()
	put(cfgName, bytesReader(cfg))
	blobs := []v1.Hash{cfgName}
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		rc, _ := l.Compressed()
		put(d, rc)
		rc.Close()
		blobs = append(blobs, d)
	}
	return Image{Ref: ref, Manifest: v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: digest}, Blobs: blobs}
}

func TestWriteLayoutIsReadByRealClients(t *testing.T) {
	cache := t.TempDir()
	a, _ := random.Image(1024, 2)
	b, _ := random.Image(2048, 1)
	// Debian 12's skopeo (c/image 5.23) finds only OCI-typed manifests in an
	// OCI layout by name; docker-typed ones are served by kiln's registry.
	b = mutate.MediaType(mutate.ConfigMediaType(b, types.OCIConfigJSON), types.OCIManifestSchema1)
	images := []Image{
		cacheImage(t, cache, "quay.io/acme/b:2", b),
		cacheImage(t, cache, "quay.io/acme/a:1", a),
		cacheImage(t, cache, "quay.io/acme/a:latest", a), // same image under two names: blobs stored once
	}
	dir := filepath.Join(t.TempDir(), "oci")
	if err := WriteLayout(dir, func(h v1.Hash) string { return filepath.Join(cache, h.Hex) }, images); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := p.ImageIndex()
	im, _ := idx.IndexManifest()
	var refs []string
	for _, d := range im.Manifests {
		refs = append(refs, d.Annotations[RefNameAnnotation])
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(img); err != nil {
			t.Fatalf("%s: %v", d.Annotations[RefNameAnnotation], err)
		}
	}
	if got, _ := json.Marshal(refs); string(got) != `["quay.io/acme/a:1","quay.io/acme/a:latest","quay.io/acme/b:2"]` {
		t.Fatalf("index order: %s", got)
	}
	// skopeo reads it by the full reference, as the node's tools will.
	out, err := exec.Command("skopeo", "inspect", "--raw", "oci:"+dir+":quay.io/acme/b:2").CombinedOutput()
	if err != nil {
		t.Fatalf("skopeo inspect: %v\n%s", err, out)
	}
	want, _ := b.RawManifest()
	if string(out) != string(want) {
		t.Fatalf("skopeo read another manifest:\n%s", out)
	}
	// Blobs are hard links to the cache, not copies.
	d, _ := a.Digest()
	// Every file is world-readable: the node's registry runs unprivileged.
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v, want 0644", p, fi.Mode().Perm())
		}
		return nil
	})
	if n := nlink(t, filepath.Join(dir, "blobs", "sha256", d.Hex)); n != 2 {
		t.Fatalf("manifest blob has %d links, want 2 (cache + layout)", n)
	}
}
