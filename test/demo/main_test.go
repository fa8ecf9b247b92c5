package main

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// The demo's release 1.1 image is a new build of hello:1.0: its layer and
// one more, so a delta stick for 1.0 carries only the new one. Both demo
// recipes name only images the generator writes.
func TestDemoInputs(t *testing.T) {
	dir := t.TempDir()
	if err := generate(dir); err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(dir, "oci")
	_, _, old, err := images.Blobs(layout, demoImages[0])
	if err != nil {
		t.Fatal(err)
	}
	_, _, upgraded, err := images.Blobs(layout, demoUpgrade)
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != 1 || len(upgraded) != 2 || upgraded[0] != old[0] {
		t.Errorf("hello:1.0 layers %v, hello:1.1 layers %v: want 1.0's layer and one more", old, upgraded)
	}
	written := append(slices.Clone(demoImages), demoUpgrade)
	for _, recipe := range []string{"../../recipes/demo.yaml", "../../recipes/demo-1.1.yaml"} {
		r, err := recipes.Load(recipe)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Trust) == 0 || len(r.Release.Files) == 0 {
			t.Errorf("%s: no trust or no release files: it shows no upgrade path", recipe)
		}
		for _, img := range r.Images {
			if !slices.Contains(written, img.Name) {
				t.Errorf("%s names %s, which the demo does not generate", recipe, img.Name)
			}
		}
	}
}
