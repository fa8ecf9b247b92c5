// Package stage lays out the image partition's tree in a staging directory:
// the OCI image layout (blobs linked from the blob cache, not copied), the
// agent binary, and kiln.json, listing every file with its digest.
package stage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// RefNameAnnotation carries each image's full reference in index.json.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// Image is one image to put in a layout.
type Image struct {
	Ref      string        // full reference workloads use, e.g. quay.io/acme/app:1.2
	Manifest v1.Descriptor // digest, size, media type of the manifest
	Blobs    []v1.Hash     // config and layers
}

// BlobSource returns the path of a blob already verified in the cache.
type BlobSource func(v1.Hash) string

// LayoutOption changes what WriteLayout writes.
type LayoutOption func(*layoutOptions)

type layoutOptions struct{ keep, borrowed func(v1.Hash) bool }

// OnlyBlobs writes only the blobs keep accepts (index.json still lists every
// image): an upgrade bundle's delta leaves out what the node already has.
func OnlyBlobs(keep func(v1.Hash) bool) LayoutOption {
	return func(o *layoutOptions) { o.keep = keep }
}

// Borrowed marks blobs whose source is not kiln's (a local layout's own
// files, fetch.Request.InPlace): they are linked but never chmodded, which
// would change the source; the packer sets their mode on the partition.
func Borrowed(borrowed func(v1.Hash) bool) LayoutOption {
	return func(o *layoutOptions) { o.borrowed = borrowed }
}

// WriteLayout writes an OCI image layout with images into dir (which must not
// exist yet). Blobs are hard-linked from src when dir is on the same
// filesystem, copied otherwise; each blob is stored once however many images
// share it. index.json lists the images sorted by reference.
func WriteLayout(dir string, src BlobSource, images []Image, opts ...LayoutOption) error {
	o := layoutOptions{keep: func(v1.Hash) bool { return true }, borrowed: func(v1.Hash) bool { return false }}
	for _, opt := range opts {
		opt(&o)
	}
	blobDir := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`+"\n"), 0o644); err != nil {
		return err
	}
	sorted := append([]Image(nil), images...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Ref < sorted[j].Ref })
	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{}}
	for _, img := range sorted {
		for _, h := range append([]v1.Hash{img.Manifest.Digest}, img.Blobs...) {
			dst := filepath.Join(blobDir, h.Hex)
			if !o.keep(h) {
				continue
			}
			if _, err := os.Lstat(dst); err == nil {
				continue
			}
			if err := linkOrCopy(src(h), dst); err != nil {
				return fmt.Errorf("stage %s blob %s: %w", img.Ref, h, err)
			}
			if o.borrowed(h) {
				continue
			}
			// The node's registry runs unprivileged: every blob must be
			// world-readable whatever mode the cache gave it.
			if err := os.Chmod(dst, 0o644); err != nil {
				return fmt.Errorf("stage %s blob %s: %w", img.Ref, h, err)
			}
		}
		d := v1.Descriptor{
			MediaType:   img.Manifest.MediaType,
			Size:        img.Manifest.Size,
			Digest:      img.Manifest.Digest,
			Annotations: map[string]string{RefNameAnnotation: img.Ref},
		}
		index.Manifests = append(index.Manifests, d)
	}
	b, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "index.json"), append(b, '\n'), 0o644)
}

// linkOrCopy hard-links src to dst, or copies it when they are on different
// filesystems (or the filesystem has no hard links).
func linkOrCopy(src, dst string) error {
	err := os.Link(src, dst)
	if err == nil || !(errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EMLINK)) {
		return err
	}
	return CopyFile(src, dst, 0o644)
}

// CopyFile copies src to dst with mode (the kernel copies the bytes where it
// can: os.File.ReadFrom uses copy_file_range).
func CopyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}
