package preload

import (
	"fmt"
	"path/filepath"

	"github.com/kiln-appliance/kiln/builder/preload/internal/layerscan"
	"go.podman.io/image/v5/types"
)

// scanLayers reads every layer blob of the image once, before anything is
// written (see layerscan): containers/storage unpacks in a chroot, so a
// hostile entry cannot reach the build host, but it silently rewrites "../x"
// and "/x" to "x" and follows symlinks the layer itself planted; an image
// doing that is broken or hostile and must not ship.
func (s source) scanLayers(layers []types.BlobInfo) error {
	for i, l := range layers {
		if err := l.Digest.Validate(); err != nil {
			return fmt.Errorf("preload %s: layer %d of %d: %w", s.img.Name, i+1, len(layers), err)
		}
		p := filepath.Join(s.img.LayoutDir, "blobs", l.Digest.Algorithm().String(), l.Digest.Encoded())
		if err := layerscan.Blob(p, l.Digest, l.Size); err != nil {
			return fmt.Errorf("preload %s: layer %d of %d (%s): %w", s.img.Name, i+1, len(layers), l.Digest, err)
		}
	}
	return nil
}
