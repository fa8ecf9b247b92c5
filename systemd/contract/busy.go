package contract

import (
	"errors"
	"fmt"
)

// ErrBusy refuses a release while another is staged or being tried: a node
// stages one release at a time.
var ErrBusy = errors.New("another release is staged or being tried")

// CheckBusy is the rule both the import's first look at a bundle
// (bundlefmt.CheckNode) and the state machine's staging (release.Machine.Import)
// apply, in the same place: after "is it this very release, already staged?"
// and "is it newer than the running one?". staged and trying are the node's
// (nil: none); next is the version to be imported, named in the remedy. It
// returns ErrBusy, wrapped with which release holds the node and what to do.
func CheckBusy(staged, trying *ReleaseID, next string) error {
	switch {
	case staged != nil:
		return fmt.Errorf("%w: release %s is staged and not yet tried; reboot the appliance to try it (or drop it: kiln agent release abandon %s), then import %s",
			ErrBusy, staged.Version, staged.Version, next)
	case trying != nil:
		return fmt.Errorf("%w: release %s is being tried; wait until its health check confirms it or rolls it back (kiln agent status), then import %s",
			ErrBusy, trying.Version, next)
	}
	return nil
}
