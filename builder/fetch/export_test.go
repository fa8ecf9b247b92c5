package fetch

import (
	"context"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/internal/progress"
)

// Fetch is fetch of one image, for the tests.
func (c *Cache) Fetch(ctx context.Context, source, baseDir, digest string, platform v1.Platform, reporter progress.Reporter) (*Image, error) {
	return c.fetch(ctx, Request{Source: source, BaseDir: baseDir, Digest: digest, Platform: platform}, reporter)
}
