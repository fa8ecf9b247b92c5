package release

import (
	"context"
	"time"

	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// WithBootID sets how the current boot is identified (default: the kernel's
// /proc/sys/kernel/random/boot_id).
func WithBootID(f func() (string, error)) Option { return func(m *Machine) { m.bootID = f } }

// WithClock sets the clock results are stamped with.
func WithClock(now func() time.Time) Option { return func(m *Machine) { m.now = now } }

// Stage records r as the release to try at the next boot. r's blobs must
// already be in the release store. Staging the same release again changes
// nothing.
func (m *Machine) Stage(ctx context.Context, r contract.Release) (*state.State, error) {
	return m.Import(ctx, r, nil)
}
