package release

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Errors a refused transition wraps; nothing is changed when one is returned.
var (
	ErrNotNewer = errors.New("release is not newer than the current one")
	ErrBusy     = contract.ErrBusy // the import's rule: contract.CheckBusy
	ErrNoSuch   = errors.New("no such release in this state")
	// ErrFailedBefore: the release was rolled back on this node since a
	// release was last confirmed; Import stages it again only with
	// RetryFailed.
	ErrFailedBefore = errors.New("failed on this node before")
)

// ImportOption changes what Import agrees to.
type ImportOption func(*importOptions)

type importOptions struct{ retryFailed bool }

// RetryFailed lets Import stage a release that failed on this node before
// (a technician's deliberate retry; the failure stays recorded until a
// release is confirmed).
func RetryFailed() ImportOption { return func(o *importOptions) { o.retryFailed = true } }

// FailedBefore is the refusal of a release that failed on this node before:
// when and why, and how to retry it deliberately.
func FailedBefore(f state.Result) error {
	return fmt.Errorf("release %s %w: rolled back on %s: %s", f.Version, ErrFailedBefore,
		time.Unix(f.Time, 0).UTC().Format("2006-01-02 15:04:05 UTC"), f.Message)
}

// maxAttempts is how many boots a trying release gets to be confirmed
// before the next boot rolls it back.
const maxAttempts = 3

// Fill puts a release's blobs into the release store's blob directory
// (blobs/sha256/<hex>, each verified as it is written), and its images into
// the node's containers/storage.
type Fill func(ctx context.Context, blobDir string) error

// Import stages r after fill has put its content on the node. fill runs only
// once the node has agreed to take r (nothing staged or trying, r newer than
// current), and under the state lock, so no converge collects its blobs
// while they are copied. When fill fails nothing is recorded; the blobs it
// left are reused by the next import (fill may skip blobs already there) or
// collected by the next converge.
func (m *Machine) Import(ctx context.Context, r contract.Release, fill Fill, opts ...ImportOption) (*state.State, error) {
	var o importOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkRelease(r); err != nil {
		return nil, fmt.Errorf("stage %s: %w", r.Version, err)
	}
	return m.transition(ctx, "stage", func(s *state.State) error {
		if r.OS == nil && s.Current.OS != nil {
			o := *s.Current.OS // images only: the release runs the OS it is staged on
			r.OS = &o
		}
		if s.Staged != nil && s.Staged.Version == r.Version && same(*s.Staged, r) {
			return errUnchanged
		}
		if c, err := contract.CompareVersions(r.Version, s.Current.Version); err != nil {
			return fmt.Errorf("stage: %w", err)
		} else if c <= 0 {
			return fmt.Errorf("stage %s: %w (%s): rollback uses the node's own previous release, never an older one", r.Version, ErrNotNewer, s.Current.Version)
		}
		if err := contract.CheckBusy(idOf(s.Staged), idOf(s.Trying), r.Version); err != nil {
			return fmt.Errorf("stage %s: %w", r.Version, err)
		}
		if err := checkSlot(s, r); err != nil {
			return fmt.Errorf("stage %s: %w", r.Version, err)
		}
		if f := s.Failure(r.Version); f != nil && !o.retryFailed {
			return fmt.Errorf("stage %s: %w", r.Version, FailedBefore(*f))
		}
		if fill != nil {
			if err := fill(ctx, filepath.Join(m.path(contract.ReleaseStore), "blobs", "sha256")); err != nil {
				return fmt.Errorf("import %s: %w", r.Version, err)
			}
		}
		if err := m.checkBlobs(r); err != nil {
			return fmt.Errorf("stage %s: %w", r.Version, err)
		}
		// The releases whose OS was in the slot r's is written into can
		// no longer boot: they are not kept (their entries are gone).
		if s.Previous != nil && ownsSlot(s.Previous, r) {
			retire(s, *s.Previous)
			s.Previous = nil
		}
		s.Staged = &r
		s.Last = m.result("stage", r.Version, true, "")
		return nil
	})
}

func idOf(r *contract.Release) *contract.ReleaseID {
	if r == nil {
		return nil
	}
	id := r.ID()
	return &id
}

// checkSlot refuses a release whose OS would be written into the slot the
// current release runs from.
func checkSlot(s *state.State, r contract.Release) error {
	c := s.Current.OS
	if r.OS == nil || c == nil || r.OS.Slot != c.Slot || r.OS.RootHash == c.RootHash {
		return nil
	}
	return fmt.Errorf("its OS (root hash %s) would be written into slot %s, which the current release %s runs from: import it again after a reboot", r.OS.RootHash, r.OS.Slot, s.Current.Version)
}

// ownsSlot says old's OS is in the slot r's OS is written into (another
// root hash in the same slot).
func ownsSlot(old *contract.Release, r contract.Release) bool {
	return old.OS != nil && r.OS != nil && old.OS.Slot == r.OS.Slot && old.OS.RootHash != r.OS.RootHash
}

// ownEntry says r boots from an entry of its own, not base's (its OS, or
// its kernel, differs).
func ownEntry(r *contract.Release, base contract.Release) bool {
	return r != nil && r.OS != nil && (base.OS == nil || r.OS.Entry != base.OS.Entry)
}

// Begin is the upgrade boot's first step, before CRI-O and the workloads
// start: a staged release becomes the one being tried, and its attempt is
// counted once per boot. A release not confirmed after the maximum number of
// boots is rolled back instead. With nothing staged or trying, Begin only
// converges (every boot may run it).
func (m *Machine) Begin(ctx context.Context) (*state.State, error) {
	boot, err := m.bootID()
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	booted, err := m.bootedEntry()
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	return m.transition(ctx, "begin", func(s *state.State) error {
		if decided, err := m.followBootLoader(s, booted); decided {
			return err
		}
		switch {
		case s.Staged != nil:
			s.Trying, s.Staged = s.Staged, nil
			s.Attempts, s.TryingBoot = 1, boot
			s.Last = m.result("begin", s.Trying.Version, true, "")
		case s.Trying == nil || s.TryingBoot == boot:
			return errUnchanged
		case s.Attempts >= maxAttempts && !ownEntry(s.Trying, s.Current):
			// (A release with an entry of its own is counted by the boot
			// loader, which boots it while it has tries: followBootLoader.)
			v := s.Trying.Version
			retire(s, *s.Trying)
			s.Trying, s.Attempts, s.TryingBoot = nil, 0, ""
			s.Last = m.result("rollback", v, false, fmt.Sprintf("not confirmed healthy after %d boots", maxAttempts))
		default:
			s.Attempts++
			s.TryingBoot = boot
			s.Last = m.result("begin", s.Trying.Version, true, fmt.Sprintf("boot %d of %d", s.Attempts, maxAttempts))
		}
		return nil
	})
}

// Confirm makes the release being tried current, once its health check
// passed: the current one becomes previous (still pinned, for rollback) and
// the one before it is retired. Confirming the current release changes nothing.
func (m *Machine) Confirm(ctx context.Context, version string) (*state.State, error) {
	return m.transition(ctx, "confirm", func(s *state.State) error {
		switch {
		case s.Trying != nil && s.Trying.Version == version:
		case s.Trying == nil && s.Current.Version == version:
			return errUnchanged
		default:
			return fmt.Errorf("confirm %s: %w (%s): only the release being tried can be confirmed", version, ErrNoSuch, describe(s))
		}
		if s.Previous != nil {
			retire(s, *s.Previous)
		}
		prev := s.Current
		s.Previous = &prev
		s.Current = *s.Trying
		s.Trying, s.Attempts, s.TryingBoot = nil, 0, ""
		s.Failed = nil // a confirmed release starts the record afresh
		s.Last = m.result("confirm", version, true, "")
		return nil
	})
}

// Rollback gives up the release being tried (its health check failed): the
// current release's files come back and the tried one is unpinned and
// retired. reason says what failed. Rolling back again changes nothing.
func (m *Machine) Rollback(ctx context.Context, version, reason string) (*state.State, error) {
	return m.transition(ctx, "rollback", func(s *state.State) error {
		switch {
		case s.Trying != nil && s.Trying.Version == version:
		case s.Trying == nil && lastWas(s, "rollback", version):
			return errUnchanged
		default:
			return fmt.Errorf("roll back %s: %w (%s): only the release being tried can be rolled back", version, ErrNoSuch, describe(s))
		}
		retire(s, *s.Trying)
		s.Trying, s.Attempts, s.TryingBoot = nil, 0, ""
		s.Last = m.result("rollback", version, false, reason)
		return nil
	})
}

// Abandon drops a staged release before it is tried (a technician changed
// their mind, or the import must start over).
func (m *Machine) Abandon(ctx context.Context, version string) (*state.State, error) {
	return m.transition(ctx, "abandon", func(s *state.State) error {
		switch {
		case s.Staged != nil && s.Staged.Version == version:
		case s.Staged == nil && lastWas(s, "abandon", version):
			return errUnchanged
		default:
			return fmt.Errorf("abandon %s: %w (%s): only a staged release can be abandoned", version, ErrNoSuch, describe(s))
		}
		retire(s, *s.Staged)
		s.Staged = nil
		s.Last = m.result("abandon", version, true, "")
		return nil
	})
}

func (m *Machine) result(action, version string, ok bool, msg string) *state.Result {
	return &state.Result{Action: action, Version: version, OK: ok, Message: msg, Time: m.now().Unix()}
}

func lastWas(s *state.State, action, version string) bool {
	return s.Last != nil && s.Last.Action == action && s.Last.Version == version
}

// retire queues r's leftovers (files, pins, blobs, images) for removal.
func retire(s *state.State, r contract.Release) {
	for i, old := range s.Retired {
		if old.Version == r.Version {
			s.Retired[i] = r
			return
		}
	}
	s.Retired = append(s.Retired, r)
}

// same reports whether two releases are the same record.
func same(a, b contract.Release) bool {
	s1, _ := state.Encode(&state.State{Current: a})
	s2, _ := state.Encode(&state.State{Current: b})
	return string(s1) == string(s2)
}

// checkRelease refuses a release record the machine could not keep safely.
func checkRelease(r contract.Release) error {
	if _, err := contract.ParseVersion(r.Version); err != nil {
		return err
	}
	for _, im := range r.Images {
		if _, err := contract.PinRefs(im); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for _, f := range r.Files {
		if err := contract.CheckReleasePath(f.Path); err != nil {
			return fmt.Errorf("release file: %w", err)
		}
		if seen[f.Path] {
			return fmt.Errorf("release file %q listed twice", f.Path)
		}
		seen[f.Path] = true
		if _, err := digest.Parse(f.Digest); err != nil {
			return fmt.Errorf("release file %q: digest %q: %v", f.Path, f.Digest, err)
		}
		if os.FileMode(f.Mode)&^os.ModePerm != 0 {
			return fmt.Errorf("release file %q: mode %#o has more than permission bits", f.Path, f.Mode)
		}
	}
	for _, b := range r.Blobs {
		if _, err := digest.Parse(b); err != nil {
			return fmt.Errorf("blob %q: %v", b, err)
		}
	}
	if r.OS != nil {
		if err := r.OS.Check(); err != nil {
			return err
		}
	}
	return checkTrust(r.Trust)
}

// checkBlobs refuses to record a release whose content is not on the node:
// every blob it keeps is in the store, every file's content is findable.
func (m *Machine) checkBlobs(r contract.Release) error {
	for _, b := range r.Blobs {
		if _, err := os.Stat(m.storeBlob(b)); err != nil {
			return fmt.Errorf("blob %s is not in the release store (%s): import the release's blobs first", b, m.path(contract.ReleaseStore))
		}
	}
	for _, f := range r.Files {
		if _, err := m.findBlob(f.Digest); err != nil {
			return fmt.Errorf("release file %s: %w", f.Path, err)
		}
	}
	return nil
}
