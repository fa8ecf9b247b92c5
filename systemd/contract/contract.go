// Package contract is what the factory writes and the node reads, each
// format whole (type, defaults, checks, encoding) and each rule once: the
// image partition and kiln.json, the node's paths and units, the registry's
// address, the release and its versions, the pins drop-in, storage.conf,
// image references. Both sides import it and it imports neither; the
// packages below it hold the larger formats (regindex: the registry's index
// of a layout; bundle: upgrade bundles; recovery: the recovery stick; slot:
// a slot image's chunks).
//
// Layout of the partition (read-only, mounted by partition GUID):
//
//	/kiln.json          Contents, written last by the builder
//	/oci/               OCI image layout (index.json, oci-layout, blobs/sha256/…)
//	/oci/kiln-registry-index.bin  the node registry's index of it (regindex.Index)
//	/storage/           containers/storage store (overlay driver), if any image is preloaded
//	/bin/kiln           the kiln binary the node's units run (agent, serve)
package contract

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/internal/version"
)

// Paths inside the image partition.
const (
	ContentsFile = "kiln.json"
	OCIDir       = "oci"
	StorageDir   = "storage"
	AgentBinary  = "bin/kiln"
)

// PartitionName is the GPT partition name of the image partition.
const PartitionName = "kiln-images"

// PartitionType is the fixed GPT partition type GUID of kiln image partitions.
// (Random, generated once for kiln; not registered anywhere.)
const PartitionType = "8B9E5D1C-6A3F-4C27-9B1E-2F6D0A4C7E51"

// Placements of the image partition on the disk (the recipe's
// imagePartition.placement): what the disk looks like to the node.
const (
	PlaceAuto       = "auto"        // before-root when the base's last partition is root, else end
	PlaceBeforeRoot = "before-root" // root moves after the image partition, so it can still grow
	PlaceEnd        = "end"         // after the base's last partition
)

// Placements lists them in the order the docs give them.
var Placements = []string{PlaceAuto, PlaceBeforeRoot, PlaceEnd}

// ContentsVersion is the schema version of kiln.json.
const ContentsVersion = 1

// Contents is kiln.json: what is on the partition, with digests.
type Contents struct {
	SchemaVersion int    `json:"schemaVersion"`
	Recipe        string `json:"recipe"`     // recipe name
	Version       string `json:"version"`    // recipe version
	Arch          string `json:"arch"`       // GOARCH
	LockDigest    string `json:"lockDigest"` // sha256 of the lock file bytes used
	Created       int64  `json:"created"`    // SOURCE_DATE_EPOCH of the build
	// Kiln is the kiln that built the disk (absent from disks built before
	// kiln recorded it).
	Kiln   version.Info `json:"kiln,omitzero"`
	Images []Image      `json:"images"`
	// Files lists every regular file on the partition except kiln.json itself,
	// sorted by path, so `kiln verify` can re-hash all of it.
	Files []File `json:"files"`
	// Registry settings the node's units need.
	Registry Registry `json:"registry"`
	// OSSlots is the OS's A/B slots, when the base has them (absent, not
	// null, when it has none: such a disk's kiln.json is as before).
	OSSlots *OSSlots `json:"osSlots,omitempty"`
	// SecureBoot is what the build signed on the ESP, when the recipe
	// made the disk Secure Boot-ready (absent otherwise).
	SecureBoot *SecureBoot `json:"secureBoot,omitempty"`
}

// Image is one container image on the partition.
type Image struct {
	Name      string `json:"name"`              // reference workloads use, as in the recipe
	Digest    string `json:"digest"`            // manifest digest (platform-specific)
	MediaType string `json:"mediaType"`         // manifest media type
	Size      int64  `json:"size"`              // manifest + config + layers, bytes
	Served    bool   `json:"served"`            // in /oci
	Preloaded bool   `json:"preloaded"`         // in /storage
	ImageID   string `json:"imageID,omitempty"` // config digest (containers/storage image ID)
}

// File is one regular file on the partition.
type File struct {
	Path   string `json:"path"` // slash-separated, relative to the partition root
	Size   int64  `json:"size"`
	Digest string `json:"digest"` // sha256:…
}

// Registry carries the recipe's registry options to the node.
type Registry struct {
	Listen      string   `json:"listen"`
	AlwaysOn    bool     `json:"alwaysOn"`
	MirrorTags  bool     `json:"mirrorTags"`
	Upstreams   []string `json:"upstreams"` // registry hosts mirrored, sorted
	PreloadMode string   `json:"preloadMode,omitempty"`
}

// Read loads kiln.json from a mounted or staged partition root.
func Read(root string) (*Contents, error) {
	f, err := os.Open(filepath.Join(root, ContentsFile))
	if err != nil {
		return nil, fmt.Errorf("read image partition contents: %w", err)
	}
	defer f.Close()
	return Decode(f)
}

// Decode parses kiln.json.
func Decode(r io.Reader) (*Contents, error) {
	var c Contents
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("parse %s: %w", ContentsFile, err)
	}
	if c.SchemaVersion != ContentsVersion {
		return nil, fmt.Errorf("%s: schema version %d, this kiln reads %d", ContentsFile, c.SchemaVersion, ContentsVersion)
	}
	if c.OSSlots != nil {
		if err := c.OSSlots.Check(); err != nil {
			return nil, fmt.Errorf("%s: %w", ContentsFile, err)
		}
	}
	return &c, nil
}

// Encode writes kiln.json deterministically (indented, trailing newline).
func (c *Contents) Encode(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(c)
}
