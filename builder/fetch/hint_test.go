package fetch

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// A layout of several images named without a tag: the hint shows the source
// as the recipe wrote it (relative to the recipe), with one of its names.
func TestWhichImageHintIsTheRecipesSource(t *testing.T) {
	dir := t.TempDir()
	for _, ref := range []string{"quay.io/acme/app:1.2", "quay.io/acme/tool:0.1"} {
		if _, err := images.HelloImage(filepath.Join(dir, "images"), ref); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Resolve(context.Background(), "oci:images", dir, amd64)
	if !errors.Is(err, ErrBadSource) {
		t.Fatalf("Resolve of a layout of two images without a tag: %v, want ErrBadSource", err)
	}
	_, hint, _ := strings.Cut(err.Error(), "; ")
	if want := "say which, e.g. source: oci:images:quay.io/acme/"; !strings.Contains(hint, want) || strings.Contains(hint, dir) {
		t.Errorf("hint %q: want %q, without the absolute path %s", hint, want, dir)
	}
}
