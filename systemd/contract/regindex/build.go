package regindex

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
)

// Build indexes the OCI layout dir as `kiln serve` does at start without
// an index file (Walker: every manifest read and verified, every blob
// lstat'ed) and returns the index the factory writes beside the layout
// (FileName). A layout with a missing or damaged blob is an error: the
// factory must not ship it. log gets the walk's warnings and errors.
func Build(dir string, log *slog.Logger) (*Index, error) {
	c := &collector{manifests: map[string]*Manifest{}, blobs: map[string]Blob{}}
	w := &Walker{Sink: c, Log: log}
	if err := w.Layout(dir); err != nil {
		return nil, err
	}
	if w.Damaged > 0 {
		return nil, fmt.Errorf("%s: %d blobs missing or of the wrong size (see the log above)", dir, w.Damaged)
	}
	return c.index(), nil
}

// collector is the Sink Build walks into.
type collector struct {
	manifests map[string]*Manifest
	blobs     map[string]Blob
	named     []named // every AddName, in order
}

// named is one name a manifest is served under.
type named struct{ repo, tag, digest string }

func (c *collector) HasManifest(d string) bool      { _, ok := c.manifests[d]; return ok }
func (c *collector) HasBlob(d string) bool          { _, ok := c.blobs[d]; return ok }
func (c *collector) AddManifest(m Manifest)         { c.manifests[m.Digest] = &m }
func (c *collector) AddBlob(d string, b Blob)       { c.blobs[d] = b }
func (c *collector) AddName(repo, tag, d, _ string) { c.named = append(c.named, named{repo, tag, d}) }

// index is what c holds as an Index: blobs in digest order, manifests in
// the order of their blobs, names in the order the walk found them.
func (c *collector) index() *Index {
	out := &Index{SchemaVersion: Version, MediaTypes: []string{}, Manifests: []IndexedManifest{}, Images: []IndexedImage{}}
	digests := make([]string, 0, len(c.blobs))
	for d := range c.blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	blobAt := make(map[string]int, len(digests))
	var hexes strings.Builder
	for i, d := range digests {
		blobAt[d] = i
		hexes.WriteString(strings.TrimPrefix(d, "sha256:"))
		out.Sizes = append(out.Sizes, c.blobs[d].Size)
	}
	out.Blobs = hexes.String()
	manifestAt := map[string]int{}
	for _, d := range digests {
		if c.manifests[d] != nil {
			manifestAt[d] = len(manifestAt)
		}
	}
	mediaTypeAt := map[string]int{}
	positions := func(ds []string, at map[string]int) []int {
		var ps []int
		for _, d := range ds {
			ps = append(ps, at[d])
		}
		return ps
	}
	for _, d := range digests {
		m := c.manifests[d]
		if m == nil {
			continue
		}
		mt, ok := mediaTypeAt[m.MediaType]
		if !ok {
			mt = len(out.MediaTypes)
			mediaTypeAt[m.MediaType] = mt
			out.MediaTypes = append(out.MediaTypes, m.MediaType)
		}
		out.Manifests = append(out.Manifests, IndexedManifest{
			Blob: blobAt[d], MediaType: mt, ArtifactType: m.ArtifactType, Annotations: m.Annotations, Subject: m.Subject,
			Children: positions(m.Children, manifestAt), Layers: positions(m.Blobs, blobAt),
		})
	}
	for _, im := range c.named {
		out.Images = append(out.Images, IndexedImage{Repository: im.repo, Tag: im.tag, Manifest: manifestAt[im.digest]})
	}
	return out
}
