// Package release is the node's release state machine: the one place that
// decides which release the node runs (current), keeps for rollback
// (previous), and tries next (staged, then trying at the upgrade boot).
//
// The state is one file (contract.StateFile). Every transition reads it,
// computes the next state, widens the CRI-O pins to cover both, writes the
// new state atomically, then converges everything derived from it: the pins
// (exactly the images of the kept releases), the release files installed on
// the node (the active release's set), the images and blobs of retired
// releases. Converging is idempotent and depends only on the state, so a
// run killed at any point is finished by the next one. See docs/upgrade.md.
package release

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Machine runs transitions on one node's release state.
type Machine struct {
	root    string
	applier PinApplier
	images  ImageRemover
	bootID  func() (string, error)
	now     func() time.Time
	log     io.Writer
	step    func(name string)
}

// Option configures a Machine.
type Option func(*Machine)

// WithRoot prefixes every node path (state, pins, store, release files, the
// image partition) with dir: tests run the machine on a tree of their own.
func WithRoot(dir string) Option { return func(m *Machine) { m.root = dir } }

// WithPinApplier sets how CRI-O is made to read rewritten pins (default:
// ReloadCRIO).
func WithPinApplier(a PinApplier) Option { return func(m *Machine) { m.applier = a } }

// WithImageRemover sets what removes retired releases' images from the
// node's containers/storage (default: none; they stay until removed by hand).
func WithImageRemover(r ImageRemover) Option { return func(m *Machine) { m.images = r } }

// WithLog sets where the machine says what it does (default: nowhere).
func WithLog(w io.Writer) Option { return func(m *Machine) { m.log = w } }

// WithStepHook calls f with the name of each step before it runs. The crash
// tests (here and the import's) use it to kill the process at every step.
func WithStepHook(f func(name string)) Option { return func(m *Machine) { m.step = f } }

// New returns a Machine for the node (root "/") unless options say otherwise.
func New(opts ...Option) *Machine {
	m := &Machine{
		applier: ReloadCRIO,
		bootID:  kernelBootID,
		now:     time.Now,
		log:     io.Discard,
		step:    func(string) {},
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// path maps a node path to where it is under the machine's root.
func (m *Machine) path(p string) string { return filepath.Join(m.root, p) }

// Load reads the state. A node that never recorded one gets an error
// wrapping os.ErrNotExist (run Init with the factory release first).
func (m *Machine) Load() (*state.State, error) {
	return state.Read(m.path(contract.StateFile))
}

// FactoryRelease is the release a factory disk holds: the image partition's
// version and images (their blobs are on the partition). kiln.json lists no
// release files; Init records the ones Ignition wrote.
func FactoryRelease(c *contract.Contents) contract.Release {
	r := contract.Release{Version: c.Version, LockDigest: c.LockDigest, Images: c.Images}
	if s := c.OSSlots; s != nil {
		r.OS = &contract.ReleaseOS{Slot: s.Active, RootHash: s.RootHash, Entry: s.Entry}
	}
	return r
}

// Init records factory as the current release when the node has no state
// yet, and converges. A factory release that lists no files gets the files
// the node has under contract.ReleaseDirs (Ignition's), their contents kept
// in the release store for a rollback. On a node with state Init only
// converges: the factory release never overrides a recorded one.
func (m *Machine) Init(ctx context.Context, factory contract.Release) (*state.State, error) {
	if err := checkRelease(factory); err != nil {
		return nil, fmt.Errorf("factory release: %w", err)
	}
	return m.transition(ctx, "init", func(s *state.State) error {
		if s.SchemaVersion != 0 {
			if s.Current.OS == nil && factory.OS != nil && s.Current.Version == factory.Version {
				s.Current.OS = factory.OS // recorded by an agent before OS slots
				return nil
			}
			return errUnchanged
		}
		if len(factory.Files) == 0 {
			if err := m.captureFiles(&factory); err != nil {
				return err
			}
		}
		if len(factory.Trust) == 0 {
			if err := m.captureTrust(&factory); err != nil {
				return err
			}
		}
		*s = state.State{SchemaVersion: state.Version, Current: factory}
		return nil
	})
}

// errUnchanged: the transition has nothing to change (it already happened);
// the run only converges.
var errUnchanged = errors.New("unchanged")

// transition is every state change: load, compute, widen the pins over old
// and new, write the new state, converge to it.
func (m *Machine) transition(ctx context.Context, action string, next func(s *state.State) error) (*state.State, error) {
	unlock, err := m.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()

	old, err := m.Load()
	if errors.Is(err, os.ErrNotExist) && action == "init" {
		old, err = &state.State{}, nil
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: the node has no release state yet (%s); it is written at boot from the image partition: %w", action, m.path(contract.StateFile), err)
		}
		return nil, fmt.Errorf("%s: %w", action, err)
	}
	s := clone(old)
	// A failure only Last holds (an older agent recorded it) is kept in
	// Failed before next moves Last on; one next records is added after.
	s.Failed = s.Failures()
	switch err := next(s); {
	case errors.Is(err, errUnchanged):
		return old, m.converge(ctx, old)
	case err != nil:
		return nil, err
	}
	s.Failed = s.Failures()
	// Pin before recording: whatever either state keeps stays pinned while
	// the state file changes, so no kill point leaves a kept image unpinned.
	m.step("widen pins")
	if err := m.syncPins(ctx, append(old.Releases(), s.Releases()...)); err != nil {
		return nil, err
	}
	m.step("write state")
	if err := m.writeState(s); err != nil {
		return nil, err
	}
	fmt.Fprintf(m.log, "release state: %s %s\n", action, describe(s))
	return s, m.converge(ctx, s)
}

func (m *Machine) writeState(s *state.State) error {
	data, err := state.Encode(s)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(m.path(contract.StateFile), data, 0o644)
}

// lock serialises the node's state changes (a boot unit and a technician's
// command, say) with an exclusive flock; the kernel drops it if we die.
func (m *Machine) lock() (func(), error) {
	p := m.path(state.Lock)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, fmt.Errorf("release state lock: %w", err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("release state lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		fmt.Fprintf(m.log, "waiting for another kiln agent (an import or a boot step) to finish with the release state\n")
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("release state lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

// clone deep-copies a state through its JSON form (the form that matters).
func clone(s *state.State) *state.State {
	if s.SchemaVersion == 0 {
		return &state.State{}
	}
	data, err := state.Encode(s)
	if err != nil {
		panic(err) // a State always encodes
	}
	c, err := state.Decode(bytes.NewReader(data))
	if err != nil {
		panic(err)
	}
	return c
}

func describe(s *state.State) string {
	d := "current " + s.Current.Version
	if s.Previous != nil {
		d += ", previous " + s.Previous.Version
	}
	if s.Staged != nil {
		d += ", staged " + s.Staged.Version
	}
	if s.Trying != nil {
		d += fmt.Sprintf(", trying %s (boot %d)", s.Trying.Version, s.Attempts)
	}
	return d
}

func kernelBootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	return string(bytes.TrimSpace(b)), nil
}
