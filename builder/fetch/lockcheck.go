package fetch

import (
	"bytes"
	"context"
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
