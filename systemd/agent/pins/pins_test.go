package pins

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

var (
	dA = "sha256:" + strings.Repeat("a", 64)
	dB = "sha256:" + strings.Repeat("b", 64)
	dC = "sha256:" + strings.Repeat("c", 64)
)

var images = []contract.Image{
	{Name: "quay.io/acme/app:1.2", Digest: dA},
	{Name: "nginx", Digest: dB},                                       // Docker Hub short name, no tag
	{Name: "registry.example.com:5000/tools/debug@" + dC, Digest: dA}, // index digest in the name, platform digest apart
	{Name: "quay.io/acme/app:1.2", Digest: dA},                        // duplicate
}

// The written file is what CRI-O reads: parse it as TOML, as CRI-O does, and
// check that every image is pinned by digest and by its name.
func TestWriteParses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "crio.conf.d", "50-kiln-pins.conf")
	if err := Write(path, images); err != nil {
		t.Fatal(err)
	}
	got := parsePins(t, path)
	want := []string{
		"docker.io/library/nginx:latest",
		"docker.io/library/nginx@" + dB,
		"quay.io/acme/app:1.2",
		"quay.io/acme/app@" + dA,
		"registry.example.com:5000/tools/debug@" + dA,
		"registry.example.com:5000/tools/debug@" + dC,
	}
	if !sort.StringsAreSorted(got) || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("pinned_images =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("mode: %v %v", fi.Mode(), err)
	}
	// Rewriting (an upgrade moving the pins) replaces the list whole and
	// leaves no temp file behind.
	if err := Write(path, images[:1]); err != nil {
		t.Fatal(err)
	}
	if got := parsePins(t, path); len(got) != 2 {
		t.Errorf("after rewrite: %v", got)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the pins file", len(entries))
	}
}

// Nothing is written when the input is bad (contract.TestPinErrors).
func TestWriteRefusesBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		im   contract.Image
		want string
	}{
		{"upper case", contract.Image{Name: "Quay.io/Acme/App:1", Digest: dA}, "not a valid image reference"},
		{"empty name", contract.Image{Digest: dA}, "not a valid image reference"},
		{"short digest", contract.Image{Name: "quay.io/a/b:1", Digest: "sha256:abc"}, "digest"},
		{"no digest", contract.Image{Name: "quay.io/a/b:1"}, "digest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "pins.conf")
			if err := Write(path, []contract.Image{tt.im}); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write: %v, want an error with %q", err, tt.want)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("bad input left a file: %v", err)
			}
		})
	}
}
