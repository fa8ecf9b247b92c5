package contract

import (
	"crypto/sha256"
	"fmt"
	"path"
	"strings"

	"github.com/coreos/go-semver/semver"

	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// Where the node keeps its releases. The release state itself, one file
// and the only record of which release the node runs, rolls back to and
// tries next, is the node's own (systemd/agent/state); the factory renders
// its path into the units.
const (
	// StateFile is the node's release state.
	StateFile = "/var/lib/kiln/state.json"
	// ReleaseStore holds the blobs of releases newer than the factory's
	// (image blobs the image partition lacks, and release files' contents),
	// content addressed and shared between releases: blobs/sha256/<hex>.
	ReleaseStore = "/var/lib/kiln/releases"
)

// ReleaseDirs are the node directories a release may own files in: Podman
// quadlets, static pod manifests, the release's own configuration. A release
// file anywhere else is refused, so an upgrade can never replace system
// files; the files found here when the node first records its state are the
// factory release's.
var ReleaseDirs = []string{
	"/etc/containers/systemd/",
	"/etc/kubernetes/manifests/",
	"/etc/kiln/release/",
}

// CheckReleasePath says why p cannot be a release file's node path, or nil.
func CheckReleasePath(p string) error {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return fmt.Errorf("%q is not a clean absolute path; write it like /etc/containers/systemd/app.container", p)
	}
	for _, dir := range ReleaseDirs {
		if rest, ok := strings.CutPrefix(p, dir); ok && rest != "" {
			return nil
		}
	}
	return fmt.Errorf("%q is outside the directories a release may own (%s)", p, strings.Join(ReleaseDirs, ", "))
}

// Release is one version of the appliance as the node knows it: the images
// its workloads run, the files it owns on the node, and the blobs it keeps
// in the release store.
type Release struct {
	Version string `json:"version"` // semver
	// LockDigest is the sha256 of the release's lock file: with Version,
	// what a delta bundle names as its base.
	LockDigest string        `json:"lockDigest,omitempty"`
	Images     []Image       `json:"images"`
	Files      []ReleaseFile `json:"files,omitempty"`
	// Blobs lists the digests this release keeps in ReleaseStore: image
	// blobs the image partition lacks and its files' contents. Anything else
	// it needs is on the image partition (the factory release keeps none).
	Blobs []string `json:"blobs,omitempty"`
	// Trust is the set of keys the node accepts bundles from once this
	// release is current (key rotation: a release brings the next set);
	// the factory release's is what Ignition wrote to TrustDir.
	Trust []TrustKey `json:"trust,omitempty"`
	// OS is where the release's OS is on a node whose OS is in A/B slots
	// (kiln.json's OSSlots): its slot and the boot loader entry that boots
	// it. nil on a node without slots.
	OS *ReleaseOS `json:"os,omitempty"`
}

// ReleaseID names one release of a recipe: its version and the digest of
// its lock file (what a delta bundle names as its base).
type ReleaseID struct {
	Version    string `json:"version"`
	LockDigest string `json:"lockDigest"`
}

// ID names r.
func (r Release) ID() ReleaseID { return ReleaseID{Version: r.Version, LockDigest: r.LockDigest} }

// ParseVersion parses a release version as semver (MAJOR.MINOR.PATCH, with
// optional -prerelease and +build).
func ParseVersion(v string) (*semver.Version, error) {
	sv, err := semver.NewVersion(v)
	if err != nil { // the library's own words ("dotted-tri") say less than an example
		return nil, fmt.Errorf("version %q is not semver: write MAJOR.MINOR.PATCH, e.g. 1.2.0 (or 1.2.0-rc.1)", v)
	}
	return sv, nil
}

// CompareVersions returns -1, 0 or 1 as a is older than, the same as or
// newer than b, by semver precedence.
func CompareVersions(a, b string) (int, error) {
	va, err := ParseVersion(a)
	if err != nil {
		return 0, err
	}
	vb, err := ParseVersion(b)
	if err != nil {
		return 0, err
	}
	return va.Compare(*vb), nil
}

// TrustDir is where a node keeps the public keys it accepts bundles from,
// one PEM file each (TrustKey.FileName): the current release's Trust.
const TrustDir = "/etc/kiln/trust"

// TrustKey is a public key bundles may be signed with.
type TrustKey struct {
	KeyID     string `json:"keyid"`     // its SSH SHA256 fingerprint ("SHA256:…")
	PublicKey string `json:"publicKey"` // PKIX PEM ("PUBLIC KEY"), as `kiln key generate` writes
}

// FileName is the key's file name in TrustDir: the first 16 hex digits of
// the sha256 of its PEM, so names never collide and never need escaping.
func (k TrustKey) FileName() string { return TrustFileName([]byte(k.PublicKey)) }

// TrustFileName is FileName for a PEM file's bytes.
func TrustFileName(pemBytes []byte) string {
	sum := sha256.Sum256(pemBytes)
	return fmt.Sprintf("%x.pub", sum[:8])
}

// ReleaseFile is one file a release owns on the node (a Podman quadlet, a
// static pod manifest, their configuration). Its content is the blob Digest,
// in ReleaseStore or on the image partition.
type ReleaseFile struct {
	Path   string `json:"path"` // absolute node path
	Mode   uint32 `json:"mode"` // permission bits
	Size   int64  `json:"size"`
	Digest string `json:"digest"` // sha256:…
}

// ReleaseOS is a release's OS on a node with A/B OS slots: the slot its /usr
// is in and the boot loader entry that boots it. Releases that share an OS
// share the record (an upgrade of the images only keeps the OS it was
// staged on). The boot loader's entry says which release the node booted,
// and the release state follows it (docs/upgrade.md).
type ReleaseOS struct {
	Slot     string `json:"slot"`     // SlotA or SlotB
	RootHash string `json:"rootHash"` // its usr slot's dm-verity root hash (hex)
	Entry    string `json:"entry"`    // its boot loader entry's ID (bootentry.Entry.ID)
	// The entry as the node writes it, for a release whose OS a bundle
	// brought; empty for the factory release's, which the factory wrote.
	Title   string   `json:"title,omitempty"`
	Version string   `json:"version,omitempty"`
	Linux   string   `json:"linux,omitempty"`
	Initrd  []string `json:"initrd,omitempty"`
	Options []string `json:"options,omitempty"`
	// UKI is, on a Secure Boot node, the sha256 of the release's signed
	// unified kernel image: its entry is that file (a type #2 entry,
	// EFI/Linux/ENTRY+3.efi), which the import puts on the ESP by digest
	// (bootentry.FilePath) for the state machine to rename into place.
	// Options is then its signed command line; Linux and Initrd are empty.
	UKI string `json:"uki,omitempty"`
}

// BootEntry is the entry the node writes for the release; false for an
// entry the node did not write (the factory's).
func (o *ReleaseOS) BootEntry() (bootentry.Entry, bool) {
	if o == nil || o.Linux == "" {
		return bootentry.Entry{}, false
	}
	return bootentry.Entry{ID: o.Entry, Title: o.Title, Version: o.Version, Linux: o.Linux, Initrd: o.Initrd, Options: o.Options}, true
}

// Check says whether the record can be kept: a slot, a root hash, an entry
// ID, and, when the node writes the entry, one that can be written.
func (o *ReleaseOS) Check() error {
	if o.Slot != SlotA && o.Slot != SlotB {
		return fmt.Errorf("OS slot %q (want %q or %q)", o.Slot, SlotA, SlotB)
	}
	if !rootHash.MatchString(o.RootHash) {
		return fmt.Errorf("OS root hash %q is not 64 lower-case hex digits (sha256)", o.RootHash)
	}
	if err := bootentry.CheckID(o.Entry); err != nil {
		return err
	}
	if e, ok := o.BootEntry(); ok {
		return e.Check()
	}
	return nil
}

// EntryID is the boot loader entry ID the node gives a release it writes an
// OS entry for: "kiln-" and its version, a '+' (semver build metadata,
// which would start the boot counter in a file name) made '_'. Versions
// compare as the boot loader orders IDs (systemd-boot's strverscmp, newest
// first), so a new release is booted first while it has tries left.
func EntryID(version string) string { return "kiln-" + strings.ReplaceAll(version, "+", "_") }
