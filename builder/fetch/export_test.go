package fetch

import (
	"context"
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/internal/progress"
)

// Fetch is fetch of one image, for the tests.
func (c *Cache) Fetch(ctx context.Context, source, baseDir, digest string, platform v1.Platform, reporter progress.Reporter) (*Image, error) {
	return c.fetch(ctx, Request{Source: source, BaseDir: baseDir, Digest: digest, Platform: platform}, reporter)
}

// Verify re-hashes the cached blob h, for the tests.
func (c *Cache) Verify(h v1.Hash) error {
	f, err := os.Open(c.Path(h))
	if err != nil {
		return fmt.Errorf("cached blob %s: %w", h, err)
	}
	defer f.Close()
	got, n, err := v1.SHA256(f)
	if err != nil {
		return fmt.Errorf("cached blob %s: %w", h, err)
	}
	if got != h {
		return fmt.Errorf("%w: cached blob %s (%s) hashes to %s (%d bytes); delete it and fetch again", ErrCorrupt, h, c.Path(h), got, n)
	}
	return nil
}
