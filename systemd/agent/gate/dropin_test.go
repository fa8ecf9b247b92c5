package gate

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

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
	path := filepath.Join("testdata", "dropin.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("%s differs from the drop-in (run go test -update if the change is intended):\n%s", path, b.Bytes())
	}
}
