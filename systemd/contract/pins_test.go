package contract

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/kiln-appliance/kiln/test/golden"
)

var (
	dA = "sha256:" + strings.Repeat("a", 64)
	dB = "sha256:" + strings.Repeat("b", 64)
	dC = "sha256:" + strings.Repeat("c", 64)
)

var images = []Image{
	{Name: "quay.io/acme/app:1.2", Digest: dA},
	{Name: "nginx", Digest: dB},                                       // Docker Hub short name, no tag
	{Name: "registry.example.com:5000/tools/debug@" + dC, Digest: dA}, // index digest in the name, platform digest apart
	{Name: "quay.io/acme/app:1.2", Digest: dA},                        // duplicate
}

func TestRenderPinsGolden(t *testing.T) {
	t.Parallel()
	got, err := RenderPins(images)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "pins.golden"), got)
}

func TestPinErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		im   Image
		want string
	}{
		{"upper case", Image{Name: "Quay.io/Acme/App:1", Digest: dA}, "not a valid image reference"},
		{"empty name", Image{Digest: dA}, "not a valid image reference"},
		{"short digest", Image{Name: "quay.io/a/b:1", Digest: "sha256:abc"}, "digest"},
		{"no digest", Image{Name: "quay.io/a/b:1"}, "digest"},
	} {
		if _, err := RenderPins([]Image{tt.im}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestRenderPinsQuotesAsTOML: characters Go's %q and TOML quote differently
// (Go writes BEL and VT as \a and \v, escapes TOML does not have, so CRI-O
// would refuse the whole file) come back whole when the drop-in is parsed. References that reach the
// pins are validated and hold none of them; the encoder makes that not
// matter.
func TestRenderPinsQuotesAsTOML(t *testing.T) {
	refs := []string{"quay.io/a\ab:1", "quay.io/c\vd:1", "quay.io/e\x7f:1", `quay.io/"f"\g:1`, "quay.io/é:1"}
	data, err := renderPins(refs)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `\a`) || !strings.Contains(string(data), `\u0007`) {
		t.Errorf("not TOML quoting:\n%s", data)
	}
	path := filepath.Join(t.TempDir(), "pins.conf")
	os.WriteFile(path, data, 0o644)
	if got, err := ReadPins(path); err != nil || strings.Join(got, "|") != strings.Join(refs, "|") {
		t.Errorf("parsed back %q, want %q", got, refs)
	}
	// What fmt's %q would have written is not TOML at all.
	bad := fmt.Sprintf("[crio.image]\npinned_images = [%q]\n", refs[0])
	var v map[string]any
	if _, err := toml.Decode(bad, &v); err == nil {
		t.Errorf("%q parsed: the test does not tell the quotings apart", bad)
	}
}
