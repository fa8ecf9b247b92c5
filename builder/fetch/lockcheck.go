package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// checkLocked asks the source what its name resolves to and refuses a
// locked digest that is neither that nor, for an index, one of its
// manifests: a lock swapped for another image's digest would otherwise
// build that image under this one's name, and a digest the source lacks
// would be blamed on an incomplete copy.
func checkLocked(ctx context.Context, lb *lazyBackend, h v1.Hash) error {
	b, err := lb.get()
	if err != nil {
		return err
	}
	d, raw, err := b.top(ctx)
	if err != nil {
		return err
	}
	if d.Digest == h || inIndex(raw, h) {
		return nil
	}
	hint := "if the source changed on purpose, run `kiln build --refresh-lock` (or `kiln lock`); otherwise restore the lock file"
	if other := otherName(b, h); other != "" {
		return fmt.Errorf("%w: %s: the lock's digest %s is the image %s in that source, not this one, which is %s; %s",
			ErrLockMismatch, lb.src, h, other, d.Digest, hint)
	}
	return fmt.Errorf("%w: %s: the lock says %s, the source has %s and no %s at all; %s",
		ErrLockMismatch, lb.src, h, d.Digest, h, hint)
}

// checkIndex refuses a locked index digest that does not pick the locked
// manifest h for the platform: two images' index digests swapped in a lock
// would otherwise build, each recorded under the other's index. The index
// is fetched by its digest (and cached, so a rebuild needs no source).
func (c *Cache) checkIndex(ctx context.Context, b *lazyBackend, index string, h v1.Hash) error {
	hint := "the lock was edited or damaged: run `kiln lock` (or build with --refresh-lock) to rewrite it"
	ih, err := v1.NewHash(index)
	if err != nil {
		return fmt.Errorf("%w: %s: %q is not a digest; %s", ErrLockedIndex, b.src, index, hint)
	}
	raw, err := c.manifest(ctx, b, ih)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%w: %s has no index %s; %s", ErrLockedIndex, b.src, ih, hint)
	}
	if err != nil {
		return err
	}
	if k, err := kindOf(raw, b.src, ih); err != nil || !k.isIndex() {
		return fmt.Errorf("%w: %s: %s is a manifest, not an index; %s", ErrLockedIndex, b.src, ih, hint)
	}
	d, err := pickPlatform(raw, b.src, b.platform)
	if err != nil {
		return fmt.Errorf("%w: index %s: %v; %s", ErrLockedIndex, ih, err, hint)
	}
	if d.Digest != h {
		return fmt.Errorf("%w: %s: index %s gives %s for %s, not the locked digest %s; %s", ErrLockedIndex, b.src, ih, d.Digest, b.platform, h, hint)
	}
	return nil
}

// localSourceThere says whether src is a layout or archive that exists.
func localSourceThere(src source) bool {
	if src.Transport == TransportDocker {
		return false
	}
	_, err := os.Stat(src.Path)
	return err == nil
}

// inIndex says whether raw is an index listing h.
func inIndex(raw []byte, h v1.Hash) bool {
	im, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return false
	}
	for _, m := range im.Manifests {
		if m.Digest == h {
			return true
		}
	}
	return false
}

// otherName finds which image of a local layout h belongs to ("" if none
// or not a layout): the name (or digest) of the entry that is, or lists, h.
func otherName(b backend, h v1.Hash) string {
	ob, ok := b.(*ociBackend)
	if !ok {
		return ""
	}
	im, err := ob.index()
	if err != nil {
		return ""
	}
	for _, e := range im.Manifests {
		match := e.Digest == h
		if !match && e.MediaType.IsIndex() {
			raw, err := ob.manifest(context.Background(), e.Digest)
			match = err == nil && inIndex(raw, h)
		}
		if match {
			if n := e.Annotations[refNameAnnotation]; n != "" {
				return n
			}
			return e.Digest.String()
		}
	}
	return ""
}
