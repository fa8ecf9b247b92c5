//go:build !nodeonly

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/internal/hosttools"
)

// The host tools each command may run (internal/hosttools has why), all
// checked before any work: a build that stops after minutes of fetching
// for want of debugfs is worse than one that names every missing package
// at once. Those a command needs only for some inputs (mksquashfs for a
// compressed image partition, xz for an .xz base, mcopy for a base with
// A/B OS slots) are checked too: the inputs are read only as work starts.
var (
	diskTools   = []string{"debugfs", "mksquashfs", "xz", "mcopy"} // build, reflash-stick
	bundleTools = []string{"debugfs", "xz", "mcopy"}
	slotTools   = []string{"mcopy"} // inspect of a disk, verify --booted
)

// needTools fails with every missing tool and the apt-get line for them.
func needTools(cmd *cobra.Command, names []string) error {
	if err := hosttools.Check(names...); err != nil {
		return fmt.Errorf("%s: %w", cmd.Name(), err)
	}
	return nil
}
