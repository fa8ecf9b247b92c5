package gate

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/golden"
)

// The drop-in as the gate writes it, for both mirror modes. The golden file
// is also what test/crio loads with CRI-O's own registries code.
func TestDropInGolden(t *testing.T) {
	var b bytes.Buffer
	for _, tags := range []bool{true, false} {
		g, err := New(&contract.Contents{
			Registry: contract.Registry{Listen: "127.0.0.1:5050", MirrorTags: tags, Upstreams: []string{"docker.io"}},
			Images: []contract.Image{
				{Name: "quay.io/acme/app:1.2", Digest: "sha256:" + strings.Repeat("a", 64), Served: true},
				{Name: "registry.example.com/acme/served:1.0", Digest: "sha256:" + strings.Repeat("b", 64), Served: true},
				{Name: "ghcr.io/acme/preloaded-only:1", Digest: "sha256:" + strings.Repeat("c", 64)},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "### mirrorTags=%v\n%s\n", tags, g.DropInContents())
	}
	golden.Check(t, filepath.Join("testdata", "dropin.golden"), b.Bytes())
}
