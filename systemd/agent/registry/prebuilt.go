package registry

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// BuildIndex indexes the OCI layout dir as `kiln serve` does at start
// without a prebuilt index (every manifest read and verified, every blob
// lstat'ed) and returns the result as the prebuilt index the factory writes
// beside the layout (contract.RegistryIndexFile). A layout with a missing
// or damaged blob is an error: the factory must not ship it.
func BuildIndex(dir string, log *slog.Logger) (*contract.RegistryIndex, error) {
	l := &loader{ix: newIndex(), log: log}
	if err := l.loadLayout(dir); err != nil {
		return nil, err
	}
	if l.ix.damaged > 0 {
		return nil, fmt.Errorf("%s: %d blobs missing or of the wrong size (see the log above)", dir, l.ix.damaged)
	}
	out := &contract.RegistryIndex{SchemaVersion: contract.RegistryIndexVersion, Images: l.named}
	for d, m := range l.ix.manifests {
		out.Manifests = append(out.Manifests, contract.IndexedManifest{
			Digest: d, MediaType: m.mediaType, Size: m.size, ArtifactType: m.artifactType,
			Annotations: m.annotations, Subject: m.subject, Children: m.children, Blobs: m.blobs,
		})
	}
	sort.Slice(out.Manifests, func(i, j int) bool { return out.Manifests[i].Digest < out.Manifests[j].Digest })
	for d, b := range l.ix.blobs {
		out.Blobs = append(out.Blobs, contract.IndexedBlob{Digest: d, Size: b.size})
	}
	sort.Slice(out.Blobs, func(i, j int) bool { return out.Blobs[i].Digest < out.Blobs[j].Digest })
	if out.Images == nil {
		out.Images = []contract.IndexedImage{}
	}
	return out, nil
}

// loadPrebuilt adds the layout at root from its prebuilt index, if it has
// one this kiln reads and that holds together; it reports whether it did.
// Nothing is read but the index: no manifest, no blob lstat. Without a
// usable index (a partition built before the index existed, a plain layout
// directory) the caller indexes the layout itself.
func (l *loader) loadPrebuilt(root string) bool {
	path := filepath.Join(root, contract.RegistryIndexFile)
	pi, err := readPrebuilt(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false
	case err != nil:
		l.log.Warn("prebuilt registry index not used: indexing the layout at start instead (slower, same content)", "file", path, "error", err)
		return false
	}
	if err := checkPrebuilt(pi); err != nil {
		l.log.Error("prebuilt registry index is inconsistent: indexing the layout at start instead; verify the image partition with `kiln verify` or reflash it",
			"file", path, "error", err)
		return false
	}
	dir := layoutBlobs(root).dirs[0]
	for _, b := range pi.Blobs {
		if _, ok := l.ix.blobs[b.Digest]; ok {
			continue // a release before holds it: the first source wins
		}
		l.ix.blobs[b.Digest] = blobFile{path: filepath.Join(dir, strings.TrimPrefix(b.Digest, "sha256:")), size: b.Size, missing: "not in the layout"}
	}
	for _, m := range pi.Manifests {
		if _, ok := l.ix.manifests[m.Digest]; ok {
			continue // read already, from a release
		}
		l.ix.manifests[m.Digest] = &manifest{
			digest: m.Digest, mediaType: m.MediaType, size: m.Size, artifactType: m.ArtifactType,
			annotations: m.Annotations, subject: m.Subject, children: m.Children, blobs: m.Blobs,
		}
	}
	for _, im := range pi.Images {
		l.addToRepo(im.Repository, im.Tag, im.Digest, path)
	}
	l.ix.prebuilt++
	return true
}

// readPrebuilt reads a prebuilt index without following a symlink.
func readPrebuilt(path string) (*contract.RegistryIndex, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return contract.DecodeRegistryIndex(io.LimitReader(f, 256<<20))
}

// checkPrebuilt checks that every digest is sha256:<64 hex> (blob paths are
// made from them) and that everything named is in the index: a damaged
// index is never half used.
func checkPrebuilt(pi *contract.RegistryIndex) error {
	blobs := make(map[string]bool, len(pi.Blobs))
	for _, b := range pi.Blobs {
		if !validDigest(b.Digest) || b.Size < 0 {
			return fmt.Errorf("blob %q (size %d) is not sha256:<64 hex> with a size", b.Digest, b.Size)
		}
		blobs[b.Digest] = true
	}
	manifests := make(map[string]bool, len(pi.Manifests))
	for _, m := range pi.Manifests {
		if !blobs[m.Digest] || m.MediaType == "" || m.Size < 0 || m.Size > maxManifestSize {
			return fmt.Errorf("manifest %q: not among the blobs, or no media type, or size %d out of bounds", m.Digest, m.Size)
		}
		manifests[m.Digest] = true
	}
	for _, m := range pi.Manifests {
		for _, b := range m.Blobs {
			if !blobs[b] {
				return fmt.Errorf("manifest %s references blob %q, which the index does not hold", m.Digest, b)
			}
		}
		for _, c := range m.Children {
			if !manifests[c] {
				return fmt.Errorf("index %s references manifest %q, which the index does not hold", m.Digest, c)
			}
		}
	}
	for _, im := range pi.Images {
		if !manifests[im.Digest] {
			return fmt.Errorf("image %s:%s names manifest %q, which the index does not hold", im.Repository, im.Tag, im.Digest)
		}
	}
	return nil
}

// bytes returns the manifest's bytes: read from its blob file and checked
// against its digest and size on the first call when it came from a
// prebuilt index, kept after (a failure too: the partition is read-only).
func (ix *index) bytes(m *manifest) ([]byte, error) {
	m.read.Do(func() {
		if m.data != nil {
			return
		}
		bf := ix.blobs[m.digest]
		if bf.path == "" {
			m.readErr = fmt.Errorf("manifest is %s", bf.missing)
			return
		}
		data, err := readVerified(bf.path, ocispec.Descriptor{Digest: digest.Digest(m.digest), Size: m.size})
		if err != nil {
			m.readErr = err
			return
		}
		m.data = data
	})
	return m.data, m.readErr
}
