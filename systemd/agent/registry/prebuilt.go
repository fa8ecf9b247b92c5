package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// loadPrebuilt adds the layout at root from its prebuilt index, if it has
// one this kiln reads and that holds together; it reports whether it did.
// Nothing is read but the index: no manifest, no blob lstat. Without a
// usable index (a partition built before the index existed, a plain layout
// directory) the caller indexes the layout itself.
func (l *loader) loadPrebuilt(root string) bool {
	path := filepath.Join(root, regindex.FileName)
	pi, err := readPrebuilt(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false
	case errors.Is(err, regindex.ErrVersion):
		// A partition built by another kiln: nothing wrong with it.
		l.log.Warn("prebuilt registry index of another version not used: indexing the layout at start instead (slower, same content)", "file", path, "error", err)
		return false
	case err != nil:
		// Outside dm-verity nothing else stops a changed index; indexing the
		// layout reads and checks every manifest itself, so what is served
		// is still exactly the layout's content.
		l.log.Error("prebuilt registry index damaged, not used: indexing the layout at start instead (slower, same content); "+
			"verify the image partition with `kiln verify` or reflash it", "file", path, "error", err)
		return false
	}
	if err := checkPrebuilt(pi); err != nil {
		l.log.Error("prebuilt registry index is inconsistent: indexing the layout at start instead; verify the image partition with `kiln verify` or reflash it",
			"file", path, "error", err)
		return false
	}
	// Every digest is a slice of one string: one allocation instead of one
	// per blob, which a start at thousands of images feels. Blob paths are
	// made on request (index.blob).
	dir := regindex.LayoutSource(root).Dirs[0] + string(filepath.Separator)
	n := pi.BlobCount()
	const dl = len("sha256:") + 64
	var ds strings.Builder
	ds.Grow(n * dl)
	for i := 0; i < n; i++ {
		ds.WriteString("sha256:")
		ds.WriteString(pi.Blobs[64*i : 64*i+64])
	}
	allDigests := ds.String()
	digests := make([]string, n)
	l.ix.grow(n, len(pi.Manifests), len(pi.Images))
	for i := range digests {
		digests[i] = allDigests[i*dl : (i+1)*dl]
		if _, ok := l.ix.blobs[digests[i]]; ok {
			continue // a release before holds it: the first source wins
		}
		l.ix.blobs[digests[i]] = blobFile{path: dir, inDir: true, size: pi.Sizes[i], missing: "not in the layout"}
	}
	manifestDigest := func(m int) string { return digests[pi.Manifests[m].Blob] }
	for _, m := range pi.Manifests {
		d := digests[m.Blob]
		if _, ok := l.ix.manifests[d]; ok {
			continue // read already, from a release
		}
		mf := &manifest{Manifest: regindex.Manifest{Digest: d, MediaType: pi.MediaTypes[m.MediaType], Size: pi.Sizes[m.Blob],
			ArtifactType: m.ArtifactType, Annotations: m.Annotations, Subject: m.Subject}}
		if len(m.Children) > 0 {
			mf.Children = make([]string, len(m.Children))
			for i, c := range m.Children {
				mf.Children[i] = manifestDigest(c)
			}
		}
		if len(m.Layers) > 0 {
			mf.Blobs = make([]string, len(m.Layers))
			for i, b := range m.Layers {
				mf.Blobs[i] = digests[b]
			}
		}
		l.ix.manifests[d] = mf
	}
	for _, im := range pi.Images {
		l.addToRepo(im.Repository, im.Tag, manifestDigest(im.Manifest), path)
	}
	l.ix.prebuilt++
	return true
}

// readPrebuilt reads a prebuilt index without following a symlink.
func readPrebuilt(path string) (*regindex.Index, error) {
	data, err := inputfile.ReadFile(path, regindex.MaxSize, inputfile.NoFollow())
	if err != nil {
		return nil, err
	}
	return regindex.Decode(data)
}

// checkPrebuilt checks that every position points into its list and every
// subject is a digest: a damaged index is never half used. (Its digests
// are sha256 by construction, so the blob paths made from them are too.)
func checkPrebuilt(pi *regindex.Index) error {
	n := pi.BlobCount()
	inBlobs := func(i int) bool { return i >= 0 && i < n }
	inManifests := func(i int) bool { return i >= 0 && i < len(pi.Manifests) }
	for i, m := range pi.Manifests {
		if !inBlobs(m.Blob) || m.MediaType < 0 || m.MediaType >= len(pi.MediaTypes) || pi.Sizes[m.Blob] > maxManifestSize ||
			(m.Subject != "" && !regindex.ValidDigest(m.Subject)) {
			return fmt.Errorf("manifest %d: blob, media type or subject out of bounds", i)
		}
		for _, c := range m.Children {
			if !inManifests(c) {
				return fmt.Errorf("manifest %d references manifest %d, which the index does not hold", i, c)
			}
		}
		for _, b := range m.Layers {
			if !inBlobs(b) {
				return fmt.Errorf("manifest %d references blob %d, which the index does not hold", i, b)
			}
		}
	}
	for _, im := range pi.Images {
		if !inManifests(im.Manifest) {
			return fmt.Errorf("image %s:%s names manifest %d, which the index does not hold", im.Repository, im.Tag, im.Manifest)
		}
	}
	return nil
}

// bytes returns the manifest's bytes: read from its blob file and checked
// against its digest and size on the first call when it came from a
// prebuilt index, kept after (a failure too: the partition is read-only).
func (ix *index) bytes(m *manifest) ([]byte, error) {
	m.read.Do(func() {
		if m.Data != nil {
			return
		}
		bf, _ := ix.blob(m.Digest)
		if bf.path == "" {
			m.readErr = fmt.Errorf("manifest is %s", bf.missing)
			return
		}
		data, err := regindex.ReadVerified(bf.path, ocispec.Descriptor{Digest: digest.Digest(m.Digest), Size: m.Size})
		if err != nil {
			m.readErr = err
			return
		}
		m.Data = data
	})
	return m.Data, m.readErr
}
