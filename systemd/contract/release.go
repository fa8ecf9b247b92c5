package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// The node's release state: one file, the only record of which release the
// node runs, rolls back to and tries next. Everything an upgrade changes (the
// CRI-O pins, the release files, the release store) is derived from it; see
// docs/upgrade.md.
const (
	// StateFile is the node's release state (State, as JSON).
	StateFile = "/var/lib/kiln/state.json"
	// ReleaseStore holds the blobs of releases newer than the factory's
	// (image blobs the image partition lacks, and release files' contents),
	// content addressed and shared between releases: blobs/sha256/<hex>.
	ReleaseStore = "/var/lib/kiln/releases"
	// PinsApplied records the digest of the pins drop-in CRI-O was last told
	// to read. It is on tmpfs: after a reboot CRI-O reads the drop-in anew.
	PinsApplied = "/run/kiln/pins.applied"
	// StateLock is held (flock) by whatever changes the release state.
	StateLock = "/run/kiln/state.lock"
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

// StateVersion is the schema version of StateFile.
const StateVersion = 1

// State is what StateFile holds. At most one of Staged and Trying is set.
type State struct {
	SchemaVersion int `json:"schemaVersion"`
	// Current is the release the node runs and has confirmed healthy (the
	// factory release until the first upgrade is confirmed).
	Current Release `json:"current"`
	// Previous is the release before Current: kept pinned, stored and
	// installable, so a rollback needs nothing from outside the node.
	Previous *Release `json:"previous,omitempty"`
	// Staged is a release imported and waiting for the upgrade boot.
	Staged *Release `json:"staged,omitempty"`
	// Trying is the release the node booted into for its health check.
	Trying *Release `json:"trying,omitempty"`
	// Attempts counts the boots that began trying Trying; TryingBoot is the
	// boot ID of the last, so beginning twice in one boot counts once.
	Attempts   int    `json:"attempts,omitempty"`
	TryingBoot string `json:"tryingBoot,omitempty"`
	// Retired are releases the state no longer keeps whose files, pins and
	// blobs are still being removed; emptied once that is done.
	Retired []Release `json:"retired,omitempty"`
	// Last is the outcome of the last transition.
	Last *Result `json:"last,omitempty"`
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

// Result is the outcome of a transition, for `kiln agent status` and monitoring.
type Result struct {
	Action  string `json:"action"`  // stage, begin, confirm, rollback, abandon
	Version string `json:"version"` // the release it moved
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
	Time    int64  `json:"time"` // Unix seconds
}

// Releases returns the releases the node keeps (Current, Previous, Staged,
// Trying): everything they need stays pinned and stored.
func (s *State) Releases() []Release {
	rs := []Release{s.Current}
	for _, r := range []*Release{s.Previous, s.Staged, s.Trying} {
		if r != nil {
			rs = append(rs, *r)
		}
	}
	return rs
}

// Active is the release whose files are installed: Trying during an upgrade
// boot, else Current.
func (s *State) Active() Release {
	if s.Trying != nil {
		return *s.Trying
	}
	return s.Current
}

// Served returns the releases the node's registry serves, in the order
// they win a tag: the active one, then Current while another is tried (the
// rollback target), then Previous (kept installable). A staged release is
// not served: nothing runs it before its upgrade boot, which starts the
// registry anew.
func (s *State) Served() []Release {
	var rs []Release
	if s.Trying != nil {
		rs = append(rs, *s.Trying)
	}
	rs = append(rs, s.Current)
	if s.Previous != nil {
		rs = append(rs, *s.Previous)
	}
	return rs
}

// ReadState loads StateFile from path. A missing file is os.ErrNotExist
// (wrapped): the node has not recorded any release yet.
func ReadState(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read release state: %w", err)
	}
	return DecodeState(bytes.NewReader(data))
}

// DecodeState parses StateFile's JSON strictly.
func DecodeState(r io.Reader) (*State, error) {
	var s State
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("parse release state: %w", err)
	}
	if s.SchemaVersion != StateVersion {
		return nil, fmt.Errorf("release state: schema version %d, this kiln reads %d", s.SchemaVersion, StateVersion)
	}
	if s.Staged != nil && s.Trying != nil {
		return nil, fmt.Errorf("release state: both staged (%s) and trying (%s); at most one may be set", s.Staged.Version, s.Trying.Version)
	}
	return &s, nil
}

// EncodeState returns StateFile's bytes (indented, trailing newline).
func EncodeState(s *State) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return nil, fmt.Errorf("encode release state: %w", err)
	}
	return b.Bytes(), nil
}
