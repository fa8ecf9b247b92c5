package release

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// PinApplier makes CRI-O read a rewritten pins drop-in. Whether CRI-O
// re-reads pinned_images on SIGHUP (reload) or only at start (restart) is
// for the CRI-O work to establish; either answer is one PinApplier.
type PinApplier interface {
	ApplyPins(ctx context.Context) error
}

// Systemctl runs systemctl with Args (the verb and the unit).
type Systemctl struct{ Args []string }

// ReloadCRIO asks a running CRI-O to reload its configuration (SIGHUP, by
// crio.service's ExecReload); a CRI-O not running reads the drop-in when it
// starts, so there is nothing to do.
var ReloadCRIO = Systemctl{Args: []string{"try-reload-or-restart", "crio.service"}}

// RestartCRIO restarts a running CRI-O (running containers keep running:
// conmon holds them); a stopped one is left alone.
var RestartCRIO = Systemctl{Args: []string{"try-restart", "crio.service"}}

// ApplyPins runs systemctl and waits for the job to finish.
func (s Systemctl) ApplyPins(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "systemctl", s.Args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s: %v: %s", strings.Join(s.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// PinApplierFunc adapts a function (a test's, or none for a node without
// CRI-O) to PinApplier.
type PinApplierFunc func(ctx context.Context) error

// ApplyPins calls f.
func (f PinApplierFunc) ApplyPins(ctx context.Context) error { return f(ctx) }

// ImageRemover removes images from the node's containers/storage (those of
// retired releases that no kept release uses). Images already gone are not
// an error: a removal killed halfway is run again.
type ImageRemover interface {
	RemoveImages(ctx context.Context, images []contract.Image) error
}
