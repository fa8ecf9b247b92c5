// Package state is the node's release state: one file (contract.StateFile),
// the only record of which release the node runs, rolls back to and tries
// next. Everything an upgrade changes (the CRI-O pins, the release files,
// the release store) is derived from it, by the release state machine
// (systemd/agent/release), its only writer; the registry, the mirror gate
// and the image restore read it. See docs/upgrade.md.
package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Lock is held (flock) by whatever changes the release state.
const Lock = "/run/kiln/state.lock"

// Version is the schema version of the state file.
const Version = 1

// State is what the state file (contract.StateFile) holds. At most one of
// Staged and Trying is set.
type State struct {
	SchemaVersion int `json:"schemaVersion"`
	// Current is the release the node runs and has confirmed healthy (the
	// factory release until the first upgrade is confirmed).
	Current contract.Release `json:"current"`
	// Previous is the release before Current: kept pinned, stored and
	// installable, so a rollback needs nothing from outside the node.
	Previous *contract.Release `json:"previous,omitempty"`
	// Staged is a release imported and waiting for the upgrade boot.
	Staged *contract.Release `json:"staged,omitempty"`
	// Trying is the release the node booted into for its health check.
	Trying *contract.Release `json:"trying,omitempty"`
	// Attempts counts the boots that began trying Trying; TryingBoot is the
	// boot ID of the last, so beginning twice in one boot counts once.
	Attempts   int    `json:"attempts,omitempty"`
	TryingBoot string `json:"tryingBoot,omitempty"`
	// Retired are releases the state no longer keeps whose files, pins and
	// blobs are still being removed; emptied once that is done.
	Retired []contract.Release `json:"retired,omitempty"`
	// Last is the outcome of the last transition.
	Last *Result `json:"last,omitempty"`
	// Failed are the releases rolled back since a release was last
	// confirmed, one per version, the latest last: the import refuses
	// them unless asked to retry, and status keeps showing them after
	// Last moves on. Confirm empties it. An agent that predates the
	// field drops it when it writes; Failures then still finds a
	// failure it recorded in Last.
	Failed []Result `json:"failed,omitempty"`
}

// Result is the outcome of a transition, for `kiln agent status` and monitoring.
type Result struct {
	Action  string `json:"action"`  // stage, begin, confirm, rollback, abandon
	Version string `json:"version"` // the release it moved
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
	Time    int64  `json:"time"` // Unix seconds
}

// Failure says whether r records a release that failed (was rolled back).
func (r *Result) Failure() bool { return r != nil && !r.OK && r.Action == "rollback" }

// Failures returns Failed with Last added when Last is a failure Failed
// does not hold yet (recorded by this transition, or by an agent that
// knows only Last), replacing an older failure of the same version.
func (s *State) Failures() []Result {
	fs := slices.Clone(s.Failed)
	l := s.Last
	if !l.Failure() {
		return fs
	}
	i := slices.IndexFunc(fs, func(r Result) bool { return r.Version == l.Version })
	switch {
	case i < 0:
		fs = append(fs, *l)
	case fs[i] != *l:
		fs = append(slices.Delete(fs, i, i+1), *l)
	}
	return fs
}

// Failure returns how version last failed on this node since a release was
// confirmed, or nil when it did not.
func (s *State) Failure(version string) *Result {
	for _, r := range slices.Backward(s.Failures()) {
		if r.Version == version {
			return &r
		}
	}
	return nil
}

// Releases returns the releases the node keeps (Current, Previous, Staged,
// Trying): everything they need stays pinned and stored.
func (s *State) Releases() []contract.Release {
	rs := []contract.Release{s.Current}
	for _, r := range []*contract.Release{s.Previous, s.Staged, s.Trying} {
		if r != nil {
			rs = append(rs, *r)
		}
	}
	return rs
}

// Active is the release whose files are installed: Trying during an upgrade
// boot, else Current.
func (s *State) Active() contract.Release {
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
func (s *State) Served() []contract.Release {
	var rs []contract.Release
	if s.Trying != nil {
		rs = append(rs, *s.Trying)
	}
	rs = append(rs, s.Current)
	if s.Previous != nil {
		rs = append(rs, *s.Previous)
	}
	return rs
}

// maxSize bounds the state file a reader takes.
const maxSize = 64 << 20

// Read loads the state file at path, never through a symlink and never
// one over 64 MiB. A missing file is os.ErrNotExist (wrapped): the node
// has not recorded any release yet.
func Read(path string) (*State, error) {
	data, err := inputfile.ReadFile(path, maxSize, inputfile.NoFollow())
	if err != nil {
		return nil, fmt.Errorf("read release state: %w", err)
	}
	return Decode(bytes.NewReader(data))
}

// Decode parses the state file's JSON. A field this agent does not know is
// one a later release's agent added, and is ignored: on a node whose boot
// loader falls back, the release before's agent takes over the state its
// successor wrote (docs/decisions.md, *Which kiln-agent runs*), so a new
// field must be one an older agent may leave out; a change an older agent
// must not misread takes a new schema version, which it refuses.
func Decode(r io.Reader) (*State, error) {
	var s State
	dec := json.NewDecoder(r)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("parse release state: %w", err)
	}
	if s.SchemaVersion != Version {
		return nil, fmt.Errorf("release state: schema version %d, this kiln reads %d", s.SchemaVersion, Version)
	}
	if s.Staged != nil && s.Trying != nil {
		return nil, fmt.Errorf("release state: both staged (%s) and trying (%s); at most one may be set", s.Staged.Version, s.Trying.Version)
	}
	return &s, nil
}

// Encode returns the state file's bytes (indented, trailing newline).
func Encode(s *State) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return nil, fmt.Errorf("encode release state: %w", err)
	}
	return b.Bytes(), nil
}
