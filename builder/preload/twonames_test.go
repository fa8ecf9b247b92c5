package preload

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"go.podman.io/storage"
)

// TestSameImageTwoNames: one image under two recipe names (a tag and its
// alias) is stored once and carries both names and both digest names.
func TestSameImageTwoNames(t *testing.T) {
	dir := t.TempDir()
	img, _ := one(t, dir, layers.Spec{Name: "quay.io/acme/app:1.2", Layers: layers.Hello()})
	alias := img
	alias.Name = "registry.example.com/mirror/app:stable"
	store := filepath.Join(dir, "store")
	res, err := Build(context.Background(), store, []Image{img, alias})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Images) != 2 || res.Images[0].ImageID != res.Images[1].ImageID {
		t.Fatalf("result %+v", res.Images)
	}
	s, err := storage.GetStore(storage.StoreOptions{GraphRoot: store, RunRoot: t.TempDir(), GraphDriverName: Driver,
		GraphDriverOptions: []string{"overlay.skip_mount_home=true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(true)
	imgs, err := s.Images()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"quay.io/acme/app:1.2", "quay.io/acme/app@" + img.Digest,
		"registry.example.com/mirror/app:stable", "registry.example.com/mirror/app@" + img.Digest}
	if len(imgs) != 1 {
		t.Fatalf("%d images in the store, want 1: %+v", len(imgs), imgs)
	}
	for _, n := range want {
		if !contains(imgs[0].Names, n) {
			t.Errorf("image names %v lack %s", imgs[0].Names, n)
		}
	}
}
