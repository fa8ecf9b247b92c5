package fetch

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/images"
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

// TestOpenRemovesStaleTemps: temp files a killed kiln left behind go once
// stale; fresh ones (another build writing now) stay.
func TestOpenRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	blobs := filepath.Join(dir, "blobs", "sha256")
	stale, fresh := filepath.Join(blobs, tempPrefix+"stale"), filepath.Join(blobs, tempPrefix+"fresh")
	for _, p := range []string{stale, fresh} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * staleAfter)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(c.Dir()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("stale temp file kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh temp file removed: %v", err)
	}
}

// TestFetchCacheFull fetches into a cache on a 1 MiB tmpfs: the error says
// the cache is full and where, and no partial blob stays behind.
func TestFetchCacheFull(t *testing.T) {
	dir := t.TempDir()
	imgs, err := images.RandomImages(filepath.Join(dir, "oci"), 1, 4<<20, 0, 11)
	if err != nil {
		t.Fatal(err)
	}
	cacheDir := filepath.Join(dir, "cache")
	if err := os.Mkdir(cacheDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", cacheDir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", cacheDir).Run() })
	c, err := Open(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Fetch(context.Background(), "oci:"+filepath.Join(dir, "oci"), "", imgs[0].Digest, amd64, nil)
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "blob cache "+cacheDir+" is full") {
		t.Fatalf("err = %v, want one saying the cache is full", err)
	}
	if n := tempFiles(t, c); len(n) > 0 {
		t.Errorf("temp files left: %v", n)
	}
}
