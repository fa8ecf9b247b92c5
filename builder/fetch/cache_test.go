package fetch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestDefaultDir(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/x/cache")
	if got := DefaultDir(); got != "/x/cache/kiln" {
		t.Errorf("DefaultDir() = %q with XDG_CACHE_HOME set", got)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "/home/tech")
	if got := DefaultDir(); got != "/home/tech/.cache/kiln" {
		t.Errorf("DefaultDir() = %q with only HOME set", got)
	}
}

// TestCacheDamaged: Verify finds a damaged cached blob, and a truncated one
// (say, from a full disk before kiln renamed blobs into place) is fetched
// again rather than trusted.
func TestCacheDamaged(t *testing.T) {
	f := newFixture(t)
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	source := "oci:" + f.ociDir + ":1.0"
	img, err := c.Fetch(context.Background(), source, "", f.single, amd64, nil)
	if err != nil {
		t.Fatal(err)
	}
	layer := img.Layers[0]
	path := c.Path(layer.Digest)
	if path != filepath.Join(c.Dir(), "blobs", "sha256", layer.Digest.Hex) {
		t.Errorf("Path = %s", path)
	}

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(layer.Digest); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Verify of a flipped blob = %v, want ErrCorrupt", err)
	}

	if err := os.Truncate(path, layer.Size/2); err != nil {
		t.Fatal(err)
	}
	if c.Has(layer) {
		t.Error("Has trusts a truncated blob")
	}
	if _, err := c.Fetch(context.Background(), source, "", f.single, amd64, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(layer.Digest); err != nil {
		t.Errorf("after refetch: %v", err)
	}
}
