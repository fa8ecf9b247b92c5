// Package localimage finds an image in the node's containers/storage the way
// kiln's agents agree on: by manifest digest, else by image ID (the config
// digest, which survives a manifest rewritten on the way in), never by name,
// which may point at other content.
package localimage

import (
	"errors"
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"
	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Find returns the IDs of the images in store (additional stores included)
// that are im; none when it is not there.
func Find(store storage.Store, im contract.Image) ([]string, error) {
	d, err := digest.Parse(im.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %s: digest %q: %v", im.Name, im.Digest, err)
	}
	found, err := store.ImagesByDigest(d)
	if err != nil {
		return nil, fmt.Errorf("look up %s in containers/storage: %w", im.Name, err)
	}
	var ids []string
	for _, f := range found {
		ids = append(ids, f.ID)
	}
	if id := strings.TrimPrefix(im.ImageID, "sha256:"); id != "" && len(ids) == 0 {
		if _, err := store.Image(id); err == nil {
			ids = append(ids, id)
		} else if !errors.Is(err, storage.ErrImageUnknown) {
			return nil, fmt.Errorf("look up %s in containers/storage: %w", im.Name, err)
		}
	}
	return ids, nil
}
