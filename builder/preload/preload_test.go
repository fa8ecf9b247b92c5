package preload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"go.podman.io/storage/pkg/reexec"
)

func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	os.Exit(m.Run())
}

func fixtures(t testing.TB, dir string) ([]Image, []layers.Written) {
	t.Helper()
	oci := filepath.Join(dir, "oci")
	w, err := layers.WriteLayout(oci,
		layers.Spec{Name: "quay.io/kiln/special:1.0", Layers: layers.Special()},
		layers.Spec{Name: "docker.io/library/hello:latest", Layers: layers.Hello()},
	)
	if err != nil {
		t.Fatal(err)
	}
	var imgs []Image
	for _, x := range w {
		imgs = append(imgs, Image{Name: x.Name, LayoutDir: oci, Digest: x.Digest.String()})
	}
	return imgs, w
}

// TestReproducible builds the same store twice, at different paths and
// times, and compares the trees entry by entry (content, modes, owners,
// xattrs, mtimes, link targets, hard links).
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	imgs, _ := fixtures(t, dir)
	var listings [][]string
	for i := range 2 {
		store := filepath.Join(dir, fmt.Sprintf("store%d", i))
		if _, err := Build(context.Background(), store, imgs, WithTime(time.Unix(1700000000, 0))); err != nil {
			t.Fatal(err)
		}
		listings = append(listings, treeListing(t, store))
		time.Sleep(1100 * time.Millisecond) // a different wall clock for the second build
	}
	if d := diffListings(listings[0], listings[1]); d != "" {
		t.Errorf("two builds differ:\n%s", d)
	}
}
