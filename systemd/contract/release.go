package contract

import (
	"crypto/sha256"
	"fmt"
	"path"
	"strings"

	"github.com/coreos/go-semver/semver"
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
	if err != nil {
		return nil, fmt.Errorf("version %q is not semver (MAJOR.MINOR.PATCH, e.g. 1.4.0): %v", v, err)
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
