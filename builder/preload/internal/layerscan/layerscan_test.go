package layerscan

import (
	"archive/tar"
	"bytes"
	"io"
	"path"
	"testing"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"go.podman.io/image/v5/pkg/compression"
)

// FuzzTar: Tar never panics, and whatever it accepts has no entry
// that is absolute or climbs out of the root.
func FuzzTar(f *testing.F) {
	for _, l := range append(layers.Special(), layers.Hello()[0],
		layers.Layer{layers.File("../x", 0o644, "x")},
		layers.Layer{layers.Symlink("s", "/etc"), layers.File("s/x", 0o644, "x")},
		layers.Layer{layers.File("a", 0o644, "a"), layers.Link("b", "a", 0o644)},
	) {
		b, err := l.Tar()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if Tar(bytes.NewReader(b)) != nil {
			return
		}
		r, _, err := compression.AutoDecompress(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("accepted, but does not decompress: %v", err)
		}
		defer r.Close()
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return
			} else if err != nil {
				t.Fatalf("accepted, but the tar is unreadable: %v", err)
			}
			for _, p := range []string{h.Name, h.Linkname} {
				if h.Typeflag != tar.TypeLink && p == h.Linkname {
					continue
				}
				c := path.Clean(p)
				if path.IsAbs(p) || c == ".." || len(c) > 2 && c[:3] == "../" {
					t.Fatalf("accepted entry %q (link %q)", h.Name, h.Linkname)
				}
			}
		}
	})
}
