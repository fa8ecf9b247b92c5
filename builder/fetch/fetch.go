package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Image is a fetched image: every blob it names is in the cache.
type Image struct {
	Source     string
	Descriptor v1.Descriptor // the platform-specific manifest
	Manifest   []byte        // its exact bytes (sha256 = Descriptor.Digest)
	Config     v1.Descriptor
	Layers     []v1.Descriptor
	// InPlace lists the blobs left in a local source (Request.InPlace)
	// instead of copied into the cache: where they are, by digest. Their
	// bytes are NOT verified; whoever uses them checks the bytes it used.
	InPlace map[v1.Hash]string
}

// Blobs lists the config and layers, in manifest order.
func (img *Image) Blobs() []v1.Descriptor {
	return append([]v1.Descriptor{img.Config}, img.Layers...)
}

// fetch makes sure the manifest digest (as locked) of r's source, its
// config and every layer are in the cache, fetching only what is missing: a
// rebuild with a warm cache does not touch the source at all. If the digest
// names an index, the manifest for r.Platform is taken from it. Bytes
// fetched are reported to reporter as one task named after the source.
func (c *Cache) fetch(ctx context.Context, r Request, reporter progress.Reporter, opts ...Option) (*Image, error) {
	source, baseDir, digest, platform := r.Source, r.BaseDir, r.Digest, r.Platform
	src, err := parseSource(source, baseDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSource, err)
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: locked digest %q: %v; run `kiln lock` again", ErrBadSource, source, digest, err)
	}
	if reporter == nil {
		reporter = progress.Discard()
	}
	b := &lazyBackend{src: src, platform: platform, o: makeOptions(opts)}

	// The lock must say what the source says: asked of a local source that
	// is there, of a registry only when the manifest must come from it
	// anyway (a rebuild from a warm cache needs no network). A damaged
	// manifest is reported as such first; a missing one as the lock's fault
	// when the source names something else.
	_, cached, _ := c.readCached(h, src)
	raw, err := c.manifest(ctx, b, h)
	if errors.Is(err, ErrNotFound) {
		if lerr := checkLocked(ctx, b, h); errors.Is(lerr, ErrLockMismatch) {
			return nil, lerr
		}
	}
	if err != nil {
		return nil, err
	}
	if !cached || localSourceThere(src) {
		if err := checkLocked(ctx, b, h); err != nil {
			return nil, err
		}
	}
	if r.IndexDigest != "" {
		if err := c.checkIndex(ctx, b, r.IndexDigest, h); err != nil {
			return nil, err
		}
	}
	k, err := kindOf(raw, src, h)
	if err != nil {
		return nil, err
	}
	if k.isIndex() {
		d, err := pickPlatform(raw, src, platform)
		if err != nil {
			return nil, err
		}
		h = d.Digest
		if raw, err = c.manifest(ctx, b, h); err != nil {
			return nil, err
		}
		if k, err = kindOf(raw, src, h); err != nil {
			return nil, err
		}
		if k.isIndex() {
			return nil, fmt.Errorf("%w: %s: nested index %s; kiln reads one level", ErrBadSource, src, h)
		}
	}
	if len(raw) > contract.MaxManifestSize {
		return nil, fmt.Errorf("%w: %s: manifest %s is %d bytes; the node's registry serves manifests of at most %d bytes (the distribution spec's limit), so the appliance could not serve it: rebuild the image with fewer layers",
			ErrBadSource, src, h, len(raw), contract.MaxManifestSize)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: parse manifest %s: %v", ErrBadSource, src, h, err)
	}
	img := &Image{
		Source:     source,
		Descriptor: v1.Descriptor{MediaType: m.MediaType, Digest: h, Size: int64(len(raw))},
		Manifest:   raw,
		Config:     m.Config,
		Layers:     m.Layers,
	}
	if img.Descriptor.MediaType == "" {
		img.Descriptor.MediaType = "application/vnd.oci.image.manifest.v1+json"
	}

	var missing []v1.Descriptor
	var total int64
	seen := map[v1.Hash]bool{} // an image may repeat a layer
	for _, d := range img.Blobs() {
		if seen[d.Digest] || c.Has(d) {
			continue
		}
		seen[d.Digest] = true
		if r.InPlace {
			if p, ok := c.inPlace(src, d); ok {
				if img.InPlace == nil {
					img.InPlace = map[v1.Hash]string{}
				}
				img.InPlace[d.Digest] = p
				continue
			}
		}
		missing = append(missing, d)
		total += d.Size
	}
	if len(missing) == 0 {
		return img, nil
	}
	task := reporter.Task(source, total)
	counter := progress.Shared(task)
	// A few layers at once, as docker and skopeo do: one stream rarely fills
	// a WAN link.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(blobJobs)
	for _, d := range missing {
		g.Go(func() error {
			open := func(ctx context.Context) (io.ReadCloser, error) { return b.blob(ctx, d) }
			copied := &byteCount{w: counter}
			if err := c.put(gctx, d, source, open, copied); err != nil {
				return err
			}
			// Another image sharing the blob may have fetched it, counted on
			// its own task: count it here too, so this task ends at its total.
			progress.Count(counter, d.Size-copied.n)
			return nil
		})
	}
	err = g.Wait()
	task.Done(err)
	if err != nil {
		return nil, err
	}
	return img, nil
}

// imageJobs is how many images FetchAll fetches at once, and blobJobs how
// many blobs of one image.
const imageJobs, blobJobs = 4, 3

// manifest returns manifest h from the cache, or fetches, checks and caches it.
func (c *Cache) manifest(ctx context.Context, b *lazyBackend, h v1.Hash) ([]byte, error) {
	raw, ok, err := c.readCached(h, b.src)
	if err != nil || ok {
		return raw, err
	}
	if raw, err = b.manifest(ctx, h); err != nil {
		return nil, err
	}
	if err := checkManifest(raw, h, b.src); err != nil {
		return nil, err
	}
	d := v1.Descriptor{Digest: h, Size: int64(len(raw))}
	open := func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }
	if err := c.put(ctx, d, b.src.String(), open, nil); err != nil {
		return nil, err
	}
	return raw, nil
}

// Request is one image for FetchAll.
type Request struct {
	Name    string // the image's name, for messages
	Source  string
	BaseDir string
	Digest  string
	// IndexDigest, when the lock has one, is the multi-arch index the
	// manifest Digest was picked from: it must list Digest for Platform.
	IndexDigest string
	Platform    v1.Platform
	// InPlace lets the blobs of a local oci: layout stay where they are
	// (Image.InPlace) when they could be hard-linked from the cache
	// directory exactly as a cached copy would be (same filesystem, mode
	// 0644, owned by this user): a cold build then reads each byte once and
	// writes it once, into the image partition, instead of first into the
	// cache. The caller must verify those blobs in what it wrote.
	InPlace bool
}

// FetchAll fetches several images, imageJobs at a time (see fetch).
// Blobs shared between them are fetched once. The result is in request
// order; the first error cancels the rest.
func (c *Cache) FetchAll(ctx context.Context, reqs []Request, reporter progress.Reporter, opts ...Option) ([]*Image, error) {
	out := make([]*Image, len(reqs))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(imageJobs)
	for i, r := range reqs {
		g.Go(func() error {
			img, err := c.fetch(ctx, r, reporter, opts...)
			if err != nil {
				return &RequestError{Index: i, Name: r.Name, Err: err}
			}
			out[i] = img
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// lazyBackend opens the source on first use, so a fetch served entirely from
// the cache needs neither the network nor the source files.
type lazyBackend struct {
	src      source
	platform v1.Platform
	o        *options
	once     sync.Once
	b        backend
	err      error
}

func (l *lazyBackend) get() (backend, error) {
	l.once.Do(func() { l.b, l.err = openBackend(l.src, l.platform, l.o) })
	return l.b, l.err
}

func (l *lazyBackend) manifest(ctx context.Context, h v1.Hash) ([]byte, error) {
	b, err := l.get()
	if err != nil {
		return nil, err
	}
	return b.manifest(ctx, h)
}

func (l *lazyBackend) blob(ctx context.Context, d v1.Descriptor) (io.ReadCloser, error) {
	b, err := l.get()
	if err != nil {
		return nil, err
	}
	return b.blob(ctx, d)
}

// byteCount passes writes on to w and counts them.
type byteCount struct {
	w io.Writer
	n int64
}

func (c *byteCount) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}
