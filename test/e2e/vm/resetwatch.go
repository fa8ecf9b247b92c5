package vm

import (
	"strings"
	"sync"
	"time"
)

// resetMarker is the kernel's last line before it resets the machine.
const resetMarker = "reboot: Restarting system"

// resetSilence is how long the console may stay silent after a reset
// before the reset button is pressed again. OVMF under TCG prints its first
// line within seconds of a reset on a quiet machine, but took over a minute
// at load 15 (each answer is logged): pressing again then would only start
// the slow firmware over.
const resetSilence = 3 * time.Minute

// maxResets bounds the presses in one run: a firmware that never answers is
// a failure (the run's timeout), not something to press forever.
const maxResets = 2

// resetWatch presses reset again when the firmware stays silent after a
// reset: the guest's own (the kernel's "reboot: Restarting system") or one
// the test pressed (a power cut). QEMU's TCG was seen to hang there once in
// a CI run (the kernel's restart line, then not one byte for 25 minutes and
// the disk never read again), where every earlier run's reboots had come
// back. The guest had finished its reboot, so a second reset is the same
// reboot; each press is logged and arms the watch again, so a firmware that
// stays silent after a press is pressed again, up to maxResets presses in a
// run. A hang in the guest's own boot is still caught by the run's timeout
// and the checks.
type resetWatch struct {
	silence  time.Duration
	press    func(silent time.Duration) // queues the reset (on the hook runner)
	answered func(after time.Duration)  // the firmware's first line after a reset (may be nil)

	mu      sync.Mutex
	timer   *time.Timer
	since   time.Time // when the watch was armed
	armed   int       // counts arms: a timer from an earlier arm must not press
	presses int
	stopped bool
}

// line sees every console line: any line after a reset means the firmware
// answered; the reset marker arms the watch.
func (w *resetWatch) line(l string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil && w.answered != nil {
		w.answered(time.Since(w.since))
	}
	w.disarm()
	if strings.Contains(l, resetMarker) {
		w.arm()
	}
}

// reset arms the watch for a reset the test pressed.
func (w *resetWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.disarm()
	w.arm()
}

func (w *resetWatch) disarm() {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.armed++
}

// arm presses reset after silence, unless a line comes first (w.mu held).
func (w *resetWatch) arm() {
	if w.stopped || w.presses >= maxResets {
		return
	}
	gen := w.armed
	w.since = time.Now()
	w.timer = time.AfterFunc(w.silence, func() {
		w.mu.Lock()
		if w.stopped || gen != w.armed {
			w.mu.Unlock()
			return // a line came in, or the run ended, meanwhile
		}
		w.timer = nil
		w.presses++
		w.arm() // and again, if this press too meets silence
		w.mu.Unlock()
		w.press(w.silence) // unlocked: it may wait for the hook runner
	})
}

// stop ends the watch; press is not called after it returns.
func (w *resetWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.disarm()
}
