package builder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"path"
	"runtime"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// inPlaceBlob is a blob mksquashfs reads straight from a local oci: source
// (fetch.Request.InPlace) rather than from the cache: the source's bytes are
// not trusted, the partition's are checked (checkInPlace).
type inPlaceBlob struct {
	path  string
	desc  v1.Descriptor
	image string // the first image naming it, for errors
	src   string
}

// collectInPlace gathers the fetched images' in-place blobs, leaving out
// those another image brought into the cache meanwhile (the cache's copy is
// verified already and is used instead).
func (b *build) collectInPlace() {
	b.inPlace = map[v1.Hash]inPlaceBlob{}
	for _, fi := range b.images {
		for _, d := range fi.image.Blobs() {
			p, ok := fi.image.InPlace[d.Digest]
			if _, seen := b.inPlace[d.Digest]; !ok || seen || b.cache.Has(d) {
				continue
			}
			b.inPlace[d.Digest] = inPlaceBlob{path: p, desc: d, image: fi.recipe.Name, src: fi.image.Source}
		}
	}
}

// blobPath is where the partition's copy of blob h is read from.
func (b *build) blobPath(h v1.Hash) string {
	if ib, ok := b.inPlace[h]; ok {
		return ib.path
	}
	return b.cache.Path(h)
}

func (b *build) isInPlace(h v1.Hash) bool { _, ok := b.inPlace[h]; return ok }

// inPlaceAttrs gives every in-place blob on the partition the mode and owner
// a cached copy has, so the disk is the same whichever way a blob came (and
// the node's unprivileged registry can read it).
func (b *build) inPlaceAttrs() ([]partitions.FileAttrs, error) {
	if len(b.inPlace) == 0 {
		return nil, nil
	}
	uid, gid, err := b.cache.NewBlobOwner()
	if err != nil {
		return nil, fmt.Errorf("blob cache: %w", err)
	}
	var attrs []partitions.FileAttrs
	for h := range b.inPlace {
		attrs = append(attrs, partitions.FileAttrs{Path: path.Join(contract.OCIDir, "blobs", h.Algorithm, h.Hex), Mode: 0o644, UID: uid, GID: gid})
	}
	sort.Slice(attrs, func(i, j int) bool { return attrs[i].Path < attrs[j].Path })
	return attrs, nil
}

// checkInPlace hashes every in-place blob as written into the image
// filesystem: a source changed or damaged after locking (even while
// mksquashfs read it) fails the build, as a bad download fails the fetch.
// The blobs are shared out among one reader per CPU, biggest first.
func (b *build) checkInPlace(ctx context.Context, open func() (fs.FS, error)) error {
	if len(b.inPlace) == 0 {
		return nil
	}
	var blobs []inPlaceBlob
	var total int64
	for _, ib := range b.inPlace {
		blobs = append(blobs, ib)
		total += ib.desc.Size
	}
	sort.Slice(blobs, func(i, j int) bool {
		if blobs[i].desc.Size != blobs[j].desc.Size {
			return blobs[i].desc.Size > blobs[j].desc.Size
		}
		return blobs[i].desc.Digest.Hex < blobs[j].desc.Digest.Hex
	})
	task := b.o.Progress.Task("check blobs read in place", total)
	counted := progress.Shared(task)
	next := make(chan inPlaceBlob)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(next)
		for _, ib := range blobs {
			select {
			case next <- ib:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range min(runtime.GOMAXPROCS(0), len(blobs)) {
		g.Go(func() error {
			fsys, err := open()
			if err != nil {
				return err
			}
			buf := make([]byte, 1<<20) // one squashfs block per read
			for ib := range next {
				if err := gctx.Err(); err != nil {
					return err
				}
				if err := checkBlob(fsys, ib, buf, counted); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err := g.Wait()
	task.Done(err)
	return err
}

func checkBlob(fsys fs.FS, ib inPlaceBlob, buf []byte, progress io.Writer) error {
	name := path.Join(contract.OCIDir, "blobs", ib.desc.Digest.Algorithm, ib.desc.Digest.Hex)
	f, err := fsys.Open(name)
	if err != nil {
		return fmt.Errorf("image %s: read back blob %s from the image filesystem: %w", ib.image, ib.desc.Digest, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(h, progress), struct{ io.Reader }{f}, buf)
	if err != nil {
		return fmt.Errorf("image %s: read back blob %s from the image filesystem: %w", ib.image, ib.desc.Digest, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); n != ib.desc.Size || got != ib.desc.Digest.String() {
		return fmt.Errorf("%w: image %s: blob %s, read from %s (%s): expected %d bytes with that digest, got %s (%d bytes); the source is damaged or changed during the build — copy it again, or run `kiln lock` if the change is intended; no disk was written",
			fetch.ErrCorrupt, ib.image, ib.desc.Digest, ib.path, ib.src, ib.desc.Size, got, n)
	}
	return nil
}
