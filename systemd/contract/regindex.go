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
// layout, as its own start-time indexing of that layout finds it.
type RegistryIndex struct {
	SchemaVersion int `json:"schemaVersion"`
	// Images are the layout's named images in index.json order (the first to
	// name a repo:tag wins it); Tag is empty for an image named by digest.
	Images []IndexedImage `json:"images"`
	// Manifests are every manifest and index served, sorted by digest.
	Manifests []IndexedManifest `json:"manifests"`
	// Blobs are every blob served (manifests included) with the size
	// their descriptors promise, sorted by digest.
	Blobs []IndexedBlob `json:"blobs"`
}

// IndexedImage is one name under which a manifest is served.
type IndexedImage struct {
	Repository string `json:"repository"`
	Tag        string `json:"tag,omitempty"`
	Digest     string `json:"digest"`
}

// IndexedManifest is one manifest or index: what is needed to answer for it
// without reading it (its bytes are read on first request).
type IndexedManifest struct {
	Digest       string            `json:"digest"`
	MediaType    string            `json:"mediaType"`
	Size         int64             `json:"size"`
	ArtifactType string            `json:"artifactType,omitempty"` // for referrers
	Annotations  map[string]string `json:"annotations,omitempty"`  // for referrers
	Subject      string            `json:"subject,omitempty"`      // digest of the manifest it refers to
	Children     []string          `json:"children,omitempty"`     // an index's manifests held in the layout
	Blobs        []string          `json:"blobs,omitempty"`        // config and layers
}

// IndexedBlob is one blob file of the layout (blobs/sha256/<hex>).
type IndexedBlob struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

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
