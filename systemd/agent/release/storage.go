package release

import (
	"context"
	"errors"
	"fmt"
	"io"

	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/localimage"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// StorageImages removes images from the node's containers/storage (the store
// CRI-O and podman use). Only writable stores are touched: an image that is
// only in an additional, read-only store (the image partition's preloaded
// one) stays. An image a container still uses is kept and said so; removing
// the container and converging again removes it.
type StorageImages struct {
	// Open opens the store; it is called only when there is something to
	// remove, so a boot with nothing retired never opens containers/storage.
	Open func() (storage.Store, error)
	Log  io.Writer
}

// RemoveImages implements ImageRemover.
func (s StorageImages) RemoveImages(ctx context.Context, images []contract.Image) error {
	log := s.Log
	if log == nil {
		log = io.Discard
	}
	store, err := s.Open()
	if err != nil {
		return fmt.Errorf("open containers/storage: %w", err)
	}
	defer store.Shutdown(false)
	for _, im := range images {
		if err := ctx.Err(); err != nil {
			return err
		}
		ids, err := localimage.Find(store, im)
		if err != nil {
			return err
		}
		for _, id := range ids {
			_, err := store.DeleteImage(id, true)
			switch {
			case err == nil:
				fmt.Fprintf(log, "containers/storage: removed %s (%s)\n", im.Name, im.Digest)
			case errors.Is(err, storage.ErrImageUnknown), errors.Is(err, storage.ErrNotAnImage):
				// Gone already, or only in a read-only store.
			case errors.Is(err, storage.ErrImageUsedByContainer):
				fmt.Fprintf(log, "containers/storage: kept %s: %v; remove that container, then run kiln agent release converge\n", im.Name, err)
			default:
				return fmt.Errorf("remove %s from containers/storage: %w", im.Name, err)
			}
		}
	}
	return nil
}
