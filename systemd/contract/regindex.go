package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// RegistryIndexFile is the node registry's index of the partition's OCI
// layout, written by the factory into the layout directory (OCIDir) after
// the layout itself: what `kiln serve` would otherwise learn at start by
// reading, hashing and parsing every manifest. The partition is read-only
// and dm-verity-checked, so the index is as trustworthy as the manifests it
// describes; the registry still checks each manifest's digest when it first
// serves it.
const RegistryIndexFile = "kiln-registry-index.json"

// RegistryIndexVersion is the version of RegistryIndex this kiln writes and
// reads. A registry that meets another version indexes the layout itself.
const RegistryIndexVersion = 1

// ErrRegistryIndexVersion is returned for a registry index of another version.
var ErrRegistryIndexVersion = errors.New("registry index of an unknown version")

// RegistryIndex is everything the node's registry serves from one OCI
// layout, as its own start-time indexing of that layout finds it. It is
// shaped to be parsed fast (the node parses it before it answers): each
// digest is written once, in Blobs, and referred to by its position.
type RegistryIndex struct {
	SchemaVersion int `json:"schemaVersion"`
	// Blobs is the lowercase hex sha256 of every blob served (manifests
	// included), 64 characters each, concatenated, in ascending order.
	// Blob i is Blobs[64*i : 64*i+64]; Sizes[i] is the size its descriptors
	// promise.
	Blobs string  `json:"blobs"`
	Sizes []int64 `json:"sizes"`
	// MediaTypes are the distinct media types of the manifests.
	MediaTypes []string `json:"mediaTypes"`
	// Manifests are every manifest and index served, in the order of their
	// blobs.
	Manifests []IndexedManifest `json:"manifests"`
	// Images are the layout's named images in index.json order (the first
	// to name a repo:tag wins it); Tag is empty for an image named by digest.
	Images []IndexedImage `json:"images"`
}

// IndexedImage is one name under which a manifest is served.
type IndexedImage struct {
	Repository string `json:"repository"`
	Tag        string `json:"tag,omitempty"`
	Manifest   int    `json:"manifest"` // position in Manifests
}

// IndexedManifest is one manifest or index: what is needed to answer for it
// without reading it (its bytes are read on first request).
type IndexedManifest struct {
	Blob         int               `json:"blob"`                   // its own bytes: position in Blobs
	MediaType    int               `json:"mediaType"`              // position in MediaTypes
	ArtifactType string            `json:"artifactType,omitempty"` // for referrers
	Annotations  map[string]string `json:"annotations,omitempty"`  // for referrers
	Subject      string            `json:"subject,omitempty"`      // digest of the manifest it refers to
	Children     []int             `json:"children,omitempty"`     // an index's manifests in the layout: positions in Manifests
	Layers       []int             `json:"blobs,omitempty"`        // config and layers: positions in Blobs
}

// BlobCount is how many blobs the index holds (len(Sizes)).
func (ix *RegistryIndex) BlobCount() int { return len(ix.Sizes) }

// BlobDigest is blob i's digest, "sha256:<hex>"; i must be below
// BlobCount and Blobs 64 characters per blob (checked by the reader).
func (ix *RegistryIndex) BlobDigest(i int) string { return "sha256:" + ix.Blobs[64*i:64*i+64] }

// DecodeRegistryIndex parses a registry index. Another schema version is
// ErrRegistryIndexVersion (wrapped).
func DecodeRegistryIndex(r io.Reader) (*RegistryIndex, error) {
	var ix RegistryIndex
	if err := json.NewDecoder(r).Decode(&ix); err != nil {
		return nil, fmt.Errorf("parse %s: %w", RegistryIndexFile, err)
	}
	if ix.SchemaVersion != RegistryIndexVersion {
		return nil, fmt.Errorf("%s: schema version %d, this kiln reads %d: %w", RegistryIndexFile, ix.SchemaVersion, RegistryIndexVersion, ErrRegistryIndexVersion)
	}
	return &ix, nil
}

// EncodeRegistryIndex returns RegistryIndexFile's bytes: compact (the node
// parses it at every start), with a trailing newline.
func EncodeRegistryIndex(ix *RegistryIndex) ([]byte, error) {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(ix); err != nil {
		return nil, fmt.Errorf("encode registry index: %w", err)
	}
	return b.Bytes(), nil
}
