package release

import (
	"errors"
	"fmt"
	"os"

	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Status is what `kiln agent status` shows: the releases, the pins CRI-O
// has, and how the last transition went.
type Status struct {
	// Recorded is false on a node whose state was never written (Current is
	// then the image partition's factory release).
	Recorded bool              `json:"recorded"`
	Current  contract.Release  `json:"current"`
	Previous *contract.Release `json:"previous,omitempty"`
	Staged   *contract.Release `json:"staged,omitempty"`
	Trying   *contract.Release `json:"trying,omitempty"`
	Attempts int               `json:"attempts,omitempty"`
	Retired  []string          `json:"retired,omitempty"` // versions still being removed
	Last     *state.Result     `json:"last,omitempty"`
	// Failed are the releases rolled back since a release was last
	// confirmed (the latest last): shown until one is, whatever Last says.
	Failed []state.Result `json:"failed,omitempty"`
	// Booted is the ID of the boot loader entry this boot came from, on a
	// node whose boot loader says (systemd-boot): whose release runs.
	Booted string   `json:"booted,omitempty"`
	Pins   []string `json:"pins"`
	// PinsCurrent says whether the pins drop-in is exactly what the state
	// derives; false means a transition was interrupted and the next run
	// (every boot runs one) will finish it.
	PinsCurrent bool `json:"pinsCurrent"`
}

// Status reads the state and the pins drop-in; it changes nothing.
func (m *Machine) Status() (*Status, error) {
	s, err := m.Load()
	recorded := err == nil
	if errors.Is(err, os.ErrNotExist) {
		c, cerr := contract.Read(m.path(contract.MountPoint))
		if cerr != nil {
			return nil, fmt.Errorf("no release state (%s) and no image partition to read the factory release from: %w", contract.StateFile, cerr)
		}
		s, err = &state.State{SchemaVersion: state.Version, Current: FactoryRelease(c)}, nil
	}
	if err != nil {
		return nil, err
	}
	st := &Status{
		Recorded: recorded, Current: s.Current, Previous: s.Previous, Staged: s.Staged, Trying: s.Trying,
		Attempts: s.Attempts, Last: s.Last, Failed: s.Failures(),
	}
	for _, r := range s.Retired {
		st.Retired = append(st.Retired, r.Version)
	}
	if st.Booted, err = m.bootedEntry(); err != nil {
		return nil, err
	}
	st.Pins, err = contract.ReadPins(m.path(contract.PinsDropIn))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var images []contract.Image
	for _, r := range s.Releases() {
		images = append(images, r.Images...)
	}
	want, err := contract.RenderPins(images)
	if err != nil {
		return nil, err
	}
	have, _ := os.ReadFile(m.path(contract.PinsDropIn))
	st.PinsCurrent = string(have) == string(want)
	if st.Pins == nil {
		st.Pins = []string{}
	}
	return st, nil
}
