package builder

import (
	"context"
	"fmt"
	"os"
	"path"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// inPlaceBlob is a blob the squashfs writer reads straight from a local oci: source
// (fetch.Request.InPlace) rather than from the cache: the source's bytes are
// not trusted, the partition's are checked (checkInPlace).
type inPlaceBlob struct {
	path  string
	desc  v1.Descriptor
	image string // the first image naming it, for errors
	src   string
	// stamp is the file's state before the filesystem is written; checked
	// says an earlier build found it whole in that state (fetch.Checked),
	// so it is not hashed again, only stamped again after; verified, that
	// this build hashed it as written and found it whole.
	stamp             fetch.Stamp
	checked, verified bool
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
			ib := inPlaceBlob{path: p, desc: d, image: fi.recipe.Name, src: fi.image.Source}
			if st, err := fetch.StampOf(p); err == nil {
				ib.stamp, ib.checked = st, b.cache.Checked(d, st)
			}
			b.inPlace[d.Digest] = ib
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
func (b *build) inPlaceAttrs() ([]squashfs.FileAttrs, error) {
	if len(b.inPlace) == 0 {
		return nil, nil
	}
	uid, gid, err := b.cache.NewBlobOwner()
	if err != nil {
		return nil, fmt.Errorf("blob cache: %w", err)
	}
	var attrs []squashfs.FileAttrs
	for h := range b.inPlace {
		attrs = append(attrs, squashfs.FileAttrs{Path: blobName(h), Mode: 0o644, UID: uid, GID: gid})
	}
	sort.Slice(attrs, func(i, j int) bool { return attrs[i].Path < attrs[j].Path })
	return attrs, nil
}

// inPlacePaths names every in-place blob in the image filesystem, for
// partitions.Assemble to hash as written (partitions.WithFileHashes).
func (b *build) inPlacePaths() []string {
	var paths []string
	for h, ib := range b.inPlace {
		if !ib.checked {
			paths = append(paths, blobName(h))
		}
	}
	sort.Strings(paths)
	return paths
}

func blobName(h v1.Hash) string { return path.Join(contract.OCIDir, "blobs", h.Algorithm, h.Hex) }

// checkInPlace compares every in-place blob as written into the image
// filesystem with its locked digest: a source changed or damaged after
// locking (even while the squashfs writer read it) fails the build, as a bad download
// fails the fetch.
func (b *build) checkInPlace(sums map[string]squashfs.FileDigest) error {
	var blobs []inPlaceBlob
	for _, ib := range b.inPlace {
		blobs = append(blobs, ib)
	}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].desc.Digest.Hex < blobs[j].desc.Digest.Hex })
	for _, ib := range blobs {
		if ib.checked {
			continue // inPlaceUnchanged
		}
		if err := ib.unchanged(); err != nil {
			return err
		}
		got, ok := sums[blobName(ib.desc.Digest)]
		if !ok {
			return fmt.Errorf("image %s: blob %s was not read back from the image filesystem", ib.image, ib.desc.Digest)
		}
		if got.Size != ib.desc.Size || got.Digest != ib.desc.Digest.String() {
			return fmt.Errorf("%w: image %s: blob %s, read from %s (%s): expected %d bytes with that digest, got %s (%d bytes); the source is damaged or changed during the build — copy it again, or run `kiln lock` if the change is intended; no disk was written",
				fetch.ErrCorrupt, ib.image, ib.desc.Digest, ib.path, ib.src, ib.desc.Size, got.Digest, got.Size)
		}
		ib.verified = true
		b.inPlace[ib.desc.Digest] = ib
	}
	return nil
}

// unchanged fails unless the blob's file is as it was stamped before the
// filesystem was written: what the writer read is what was stamped (and,
// for a checked blob, what an earlier build hashed).
func (ib inPlaceBlob) unchanged() error {
	if now, err := fetch.StampOf(ib.path); err != nil || !now.SameContent(ib.stamp) {
		return fmt.Errorf("%w: image %s: blob %s, read from %s (%s), changed while the disk was written; no disk was written, build again",
			fetch.ErrCorrupt, ib.image, ib.desc.Digest, ib.path, ib.src)
	}
	return nil
}

// inPlaceUnchanged checks, after the disk is written, that every in-place
// blob not hashed this time (an earlier build checked its file in this
// state) is still in that state.
func (b *build) inPlaceUnchanged() error {
	for _, ib := range b.inPlace {
		if ib.checked {
			if err := ib.unchanged(); err != nil {
				return err
			}
		}
	}
	return nil
}

// rememberInPlace, once the disk is committed, removes the staging tree
// (its hard links to the sources moved their ctime, and would again) and
// records every in-place blob found whole, by its final stamp, so the next
// build need not hash it again. A blob that cannot be recorded is hashed
// next time: nothing here fails the build.
func (b *build) rememberInPlace(context.Context) error {
	if b.work != "" {
		os.RemoveAll(b.work)
		b.work = ""
	}
	for _, ib := range b.inPlace {
		if !ib.checked && !ib.verified {
			continue
		}
		if now, err := fetch.StampOf(ib.path); err == nil && now.SameContent(ib.stamp) {
			b.cache.RecordChecked(ib.desc, now)
		}
	}
	return nil
}
