package vm

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestResetWatch: silence after the reset marker presses reset (at most
// maxResets times in a run); any console line after the marker, another
// line than the marker, or the end of the run does not.
func TestResetWatch(t *testing.T) {
	const silence = 20 * time.Millisecond
	wait := func() { time.Sleep(5 * silence) }
	for _, tc := range []struct {
		name  string
		lines []string
		stop  bool
		want  int32
	}{
		{"silent after the reset", []string{"[   55.1] " + resetMarker}, false, maxResets},
		{"firmware answers", []string{resetMarker, "BdsDxe: loading Boot0001"}, false, 0},
		{"no reset", []string{"[  OK  ] Reached target reboot.target"}, false, 0},
		{"run ended", []string{resetMarker}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pressed atomic.Int32
			w := &resetWatch{silence: silence, press: func(time.Duration) { pressed.Add(1) }}
			for _, l := range tc.lines {
				w.line(l)
			}
			if tc.stop {
				w.stop()
			}
			wait()
			if got := pressed.Load(); got != tc.want {
				t.Errorf("pressed %d times, want %d", got, tc.want)
			}
		})
	}
	t.Run("silent after a press: pressed again, up to maxResets", func(t *testing.T) {
		var pressed atomic.Int32
		w := &resetWatch{silence: silence, press: func(time.Duration) { pressed.Add(1) }}
		w.line(resetMarker)
		time.Sleep(time.Duration(maxResets+3) * silence * 2)
		if got := pressed.Load(); got != maxResets {
			t.Errorf("pressed %d times, want %d", got, maxResets)
		}
	})
	t.Run("a reset the test pressed arms it", func(t *testing.T) {
		var pressed atomic.Int32
		var w *resetWatch
		w = &resetWatch{silence: silence, press: func(time.Duration) {
			pressed.Add(1)
			w.line("BdsDxe: loading Boot0001") // the firmware answers this press
		}}
		w.reset()
		wait()
		if got := pressed.Load(); got != 1 {
			t.Errorf("pressed %d times, want 1", got)
		}
	})
	t.Run("at most maxResets presses", func(t *testing.T) {
		var pressed atomic.Int32
		w := &resetWatch{silence: silence, press: func(time.Duration) { pressed.Add(1) }}
		for i := 0; i < maxResets+2; i++ {
			w.line(resetMarker)
			wait()
		}
		if got := pressed.Load(); got != maxResets {
			t.Errorf("pressed %d times, want %d", got, maxResets)
		}
	})
}
