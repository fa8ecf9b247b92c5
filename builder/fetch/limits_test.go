package fetch

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// A manifest the node's registry would refuse to serve (over
// contract.MaxManifestSize) fails the fetch, naming the image and the limit,
// instead of building a disk whose registry will not start.
func TestFetchRefusesManifestOverNodeLimit(t *testing.T) {
	t.Parallel()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	big := mutate.Annotations(img, map[string]string{"padding": strings.Repeat("x", contract.MaxManifestSize)}).(v1.Image)
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(big, layout.WithAnnotations(map[string]string{images.RefNameAnnotation: "quay.io/acme/big:1"})); err != nil {
		t.Fatal(err)
	}
	d, err := big.Digest()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.FetchAll(context.Background(), []Request{{Name: "quay.io/acme/big:1", Source: "oci:" + dir, Digest: d.String(), Platform: amd64}}, nil)
	if !errors.Is(err, ErrBadSource) {
		t.Fatalf("err = %v, want ErrBadSource", err)
	}
	for _, want := range []string{"image quay.io/acme/big:1", "manifest " + d.String(), "at most " + strconv.Itoa(contract.MaxManifestSize) + " bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}
