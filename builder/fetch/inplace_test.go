package fetch

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// With Request.InPlace, a local layout's blobs that a cached copy could
// stand for stay where they are (nothing written into the cache); one whose
// extended attributes a cached copy would lack is fetched as before.
func TestFetchInPlace(t *testing.T) {
	dir := t.TempDir()
	oci := filepath.Join(dir, "oci")
	digest, err := images.HelloImage(oci, "quay.io/acme/app:1", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(filepath.Join(dir, "cache")) // same filesystem as the layout
	if err != nil {
		t.Fatal(err)
	}
	_, config, layers, err := images.Blobs(oci, "quay.io/acme/app:1")
	if err != nil {
		t.Fatal(err)
	}
	blob := func(d string) string { return filepath.Join(oci, "blobs", "sha256", d[len("sha256:"):]) }
	if err := os.Chmod(blob(layers[0]), 0o600); err != nil { // mode may differ: set when packed
		t.Fatal(err)
	}
	if err := unix.Setxattr(blob(config), "user.kiln-test", []byte("x"), 0); err != nil {
		t.Fatalf("this test needs user xattrs on %s: %v", dir, err)
	}
	req := Request{Source: "oci:" + oci + ":quay.io/acme/app:1", Digest: digest, Platform: amd64, InPlace: true}
	imgs, err := c.FetchAll(context.Background(), []Request{req}, nil)
	if err != nil {
		t.Fatal(err)
	}
	img := imgs[0]
	for _, l := range img.Layers {
		if got := img.InPlace[l.Digest]; got != blob(l.Digest.String()) {
			t.Errorf("layer %s: in place at %q, want %s", l.Digest, got, blob(l.Digest.String()))
		}
		if c.Has(l) {
			t.Errorf("layer %s was copied into the cache", l.Digest)
		}
	}
	if _, ok := img.InPlace[img.Config.Digest]; ok || !c.Has(img.Config) {
		t.Errorf("config with an xattr a cached copy lacks: in place %v, cached %v; want it fetched", ok, c.Has(img.Config))
	}
	if fi, _ := os.Stat(blob(layers[0])); fi.Mode().Perm() != 0o600 {
		t.Errorf("source layer's mode changed to %v", fi.Mode())
	}
	// Without InPlace (bundles, preloaded images) every blob is cached.
	req.InPlace = false
	imgs, err = c.FetchAll(context.Background(), []Request{req}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs[0].InPlace) != 0 {
		t.Errorf("in place without asking: %v", imgs[0].InPlace)
	}
	checkCached(t, c, imgs[0])
}
