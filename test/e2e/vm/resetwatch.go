package vm

import (
	"strings"
	"sync"
	"time"
)

// resetMarker is the kernel's last line before it resets the machine.
const resetMarker = "reboot: Restarting system"

// resetSilence is how long the console may stay silent after a reset
// before the reset button is pressed again. OVMF under TCG prints its boot
// line within seconds of a reset.
const resetSilence = 3 * time.Minute

// maxResets bounds the presses in one run: a firmware that never answers is
// a failure (the run's timeout), not something to press forever.
const maxResets = 2

// resetWatch presses reset again when the firmware stays silent after the
// guest reset the machine. QEMU's TCG was seen to hang there once in a CI
// run (the kernel's "reboot: Restarting system", then not one byte for 25
// minutes and the disk never read again), where every earlier run's
// reboots had come back. The guest had finished its reboot, so a second reset is the
// same reboot; each press is logged, and a hang in the guest's own boot is
// still caught by the run's timeout and the checks.
type resetWatch struct {
	silence time.Duration
	press   func(silent time.Duration) // queues the reset (on the hook runner)

	mu      sync.Mutex
	timer   *time.Timer
	presses int
	stopped bool
}

// line sees every console line: any line after a reset means the firmware
// answered; the reset marker arms the watch.
func (w *resetWatch) line(l string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if w.stopped || w.presses >= maxResets || !strings.Contains(l, resetMarker) {
		return
	}
	w.timer = time.AfterFunc(w.silence, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.stopped || w.timer == nil {
			return // a line came in or the run ended meanwhile
		}
		w.timer = nil
		w.presses++
		w.press(w.silence)
	})
}

// stop ends the watch; press is not called after it returns.
func (w *resetWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
}
