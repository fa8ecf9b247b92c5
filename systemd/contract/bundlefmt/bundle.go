// Package bundlefmt is the format of kiln's field upgrade bundles: what the
// factory writes (`kiln bundle`) and the node reads (import from a USB stick
// or a file). It holds the manifest types, the on-stick header, signing and
// verification (DSSE envelopes, ed25519), and the checks the node makes
// before it changes anything: genuine, meant for it, newer, fits on its disk.
//
// A bundle's bytes (the stick's one partition, or the whole file of
// `--format file`) are:
//
//	0        header: Magic, format version, header size, envelope length
//	24       the DSSE envelope (JSON), its payload the Manifest
//	...      zeros up to HeaderSize (a multiple of 4 KiB)
//	HeaderSize  a squashfs filesystem of Manifest.Filesystem.Size bytes
//
// The manifest comes first and is small, so the node reads and checks it
// without reading the rest. It pins every file of the filesystem by its
// digest and the bytes around them by Filesystem.Metadata, so one signature
// covers every byte of the bundle.
//
// Layout of the filesystem:
//
//	/oci/               OCI image layout: index.json lists every image of the
//	                    release; blobs/ holds only the blobs on the stick
//	/release/PATH       the release's files, by their absolute node path
//	/bin/kiln           the kiln agent the release runs (a delta may leave it out)
//	/os/sha256/HEX      the OS section's files by digest (schema 3): slot
//	                    indexes, the pack, kernel and initramfs
package bundlefmt

import (
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Paths inside the bundle's filesystem.
const (
	OCIDir      = "oci"
	ReleaseDir  = "release"
	AgentBinary = "bin/kiln"
)

// PartitionName is the GPT partition name of a bundle stick's partition.
const PartitionName = "kiln-bundle"

// PartitionType is the GPT partition type GUID of kiln bundle partitions: the
// node's udev rule matches it (ID_PART_ENTRY_TYPE). Random, generated once
// for kiln; not registered anywhere.
const PartitionType = "3C0A7F52-9E1D-4B8A-A6F3-5D2E8C41B907"

// PayloadType is the DSSE payload type of a bundle manifest.
const PayloadType = "application/vnd.kiln.bundle.manifest.v1+json"

// SchemaVersion is the newest version of Manifest this kiln writes; it
// reads every version from MinSchemaVersion on. Schema 2 added Kiln and
// AgentVersion, schema 3 (OSSchemaVersion) OS. A reader refuses a newer
// manifest as made by a newer kiln (ErrNewerKiln), looking at nothing but
// its schemaVersion (and kiln, to name it), so a later schema may add
// fields. A writer uses the oldest schema that holds what the bundle
// carries: a bundle without an OS section is schema 2, as before schema 3.
// See docs/bundles.md, "Compatibility".
const (
	SchemaVersion    = 3
	MinSchemaVersion = 1
	// NoOSSchemaVersion is the schema of a bundle without an OS section.
	NoOSSchemaVersion = 2
	// OSSchemaVersion is the first schema with an OS section.
	OSSchemaVersion = 3
)

// Kinds of bundle.
const (
	KindFull  = "full"  // every blob of the release; applies to any earlier release
	KindDelta = "delta" // only blobs its base releases lack; applies to those
)

// Manifest is what a bundle holds and whom it is for. Every byte count the
// node needs for its space check is here.
type Manifest struct {
	SchemaVersion int    `json:"schemaVersion"`
	Recipe        string `json:"recipe"`     // recipe name
	Version       string `json:"version"`    // release version (semver)
	Arch          string `json:"arch"`       // GOARCH
	LockDigest    string `json:"lockDigest"` // sha256 of the release's lock file
	Created       int64  `json:"created"`    // SOURCE_DATE_EPOCH of the bundle
	// Kiln is the kiln that made the bundle (schema 2 on; absent in 1).
	Kiln version.Info `json:"kiln,omitzero"`

	Kind string `json:"kind"` // KindFull or KindDelta
	// AppliesTo lists the releases a delta applies to (its bases); empty
	// for a full bundle, which applies to any earlier release.
	AppliesTo []contract.ReleaseID `json:"appliesTo,omitempty"`

	Images []Image `json:"images"` // every image of the release, sorted by name
	Blobs  []Blob  `json:"blobs"`  // every blob the images name, sorted by digest
	Space  Space   `json:"space"`

	// ReleaseFiles are the release's files (contract.ReleaseFile: the node's
	// own record of them), stored at ReleaseDir + Path; sorted by path.
	ReleaseFiles []contract.ReleaseFile `json:"releaseFiles"`
	// Agent is the kiln agent the release runs. AgentOnStick: it is at
	// AgentBinary; a delta leaves it out when every base runs this very
	// agent (same digest), and the node keeps the one it has.
	Agent        File `json:"agent"`
	AgentOnStick bool `json:"agentOnStick"`
	// AgentVersion says which kiln the agent is: edition, version, Go
	// (schema 2 on; absent in 1).
	AgentVersion version.Info `json:"agentVersion,omitzero"`
	// Trust is the key set the node trusts once this release is confirmed
	// (key rotation: the bundle itself is signed by a key the node trusts now).
	Trust []contract.TrustKey `json:"trust"`

	// OS is the release's OS in A/B slots (schema 3 on): nil when the
	// release's base has none.
	OS *OS `json:"os,omitempty"`

	Filesystem Filesystem `json:"filesystem"`
	// Files lists every regular file in the filesystem, sorted by path.
	Files []File `json:"files"`
}

// Image is one container image of the release: the node's record of it
// (its fields are kiln.json's, the release state's) and its blobs.
type Image struct {
	contract.Image
	Blobs []string `json:"blobs"` // config then layers, digests (details in Manifest.Blobs)
}

// Blob is one blob (manifest, config or layer) of the release.
type Blob struct {
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	MediaType string `json:"mediaType"`
	// OnStick: the blob is in the bundle's /oci/blobs. A delta leaves out
	// what its bases hold.
	OnStick bool `json:"onStick"`
	// Unpacked is a layer's size once uncompressed (what containers/storage
	// stores), for the layers on the stick; 0 otherwise.
	Unpacked int64 `json:"unpacked,omitempty"`
}

// Space is what the node needs free on /var before it starts an import.
type Space struct {
	CopyBytes     int64 `json:"copyBytes"`     // the blobs on the stick, copied into the release store
	UnpackedBytes int64 `json:"unpackedBytes"` // their layers unpacked in containers/storage
}

// Need is the free space the node's import requires: the copied blobs and
// their unpacked layers.
func (s Space) Need() int64 { return s.CopyBytes + s.UnpackedBytes }

// File is one regular file in the bundle's filesystem. Its contents are
// stored uncompressed and contiguous at Offset: the node copies a blob
// straight from that byte range, hashing it, without mounting the stick.
type File struct {
	Path   string `json:"path"` // slash-separated, relative to the filesystem root
	Size   int64  `json:"size"`
	Digest string `json:"digest"` // sha256:…
	Offset int64  `json:"offset"` // where its Size bytes start in the filesystem
}

// Filesystem is the squashfs after the header. Every byte of it is pinned:
// each file's contents by its digest at its offset (Manifest.Files), every
// other byte (the superblock, squashfs's tables, padding) by Metadata. So the
// factory hashes only the bytes whose digest it did not know already (the
// blobs are named by theirs), and the node reads only what it copies.
type Filesystem struct {
	Size int64 `json:"size"` // bytes (a multiple of 4 KiB)
	// Metadata is the sha256 of the bytes outside every file's contents,
	// in order ("sha256:…").
	Metadata string `json:"metadata"`
}
