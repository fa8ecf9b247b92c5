package vm

import (
	"fmt"
	"strings"
	"time"
)

// ShutdownMarker starts the console line a guest prints right before it
// asks for an orderly shutdown (systemctl reboot or poweroff), so the
// harness can time the shutdown from the request.
const ShutdownMarker = "KILN-E2E-SHUTDOWN:"

// shutdownRequests are console lines that ask for an orderly shutdown: the
// guest's marker, and what kiln prints before a rollback reboots
// (FailureAction=reboot) or a reflash stick powers off.
var shutdownRequests = []string{ShutdownMarker, "; rolled back to ", "remove the stick and power on"}

// shutdownEnds are the kernel's last lines before it resets or powers off.
var shutdownEnds = []string{"reboot: Restarting system", "reboot: Power down", "reboot: System halted"}

// shutdownStalls are console lines an orderly shutdown must never show:
// a stop job waiting out its timeout (systemd prints the first after a few
// seconds of waiting, the others when the timeout ends), a filesystem that
// could not be unmounted, and kiln's image partition alarm (a false alarm
// when the partition was merely being unmounted).
var shutdownStalls = []string{"A stop job is running", "Timed out", "timed out", "Failed unmounting", "kiln: the image partition"}

// DefaultShutdownBound is how long an orderly shutdown may take, from its
// request to the kernel's last line, before the run fails: a hang nothing
// else shows. A stop job that waits out systemd's 90 s timeout is caught by
// its own console lines (shutdownStalls: the spinner appears within
// seconds), not by the clock: under TCG on a loaded 2-core machine a clean
// shutdown with the kubelet's graceful node shutdown (pods stopped within
// 20 s) took 82 s (copy mode, three guests and the unit tests beside it), so
// a bound under 90 s failed runs that stalled on nothing.
const DefaultShutdownBound = 150 * time.Second

// Shutdown is one orderly shutdown the console shows.
type Shutdown struct {
	Request string        // the line that asked for it ("" when none did: a shutdown not timed)
	Took    time.Duration // from the request to the kernel's last line
	Reset   time.Duration // from the kernel's last line to the next line (the firmware's, after a reboot); 0 at the end
	End     string        // the kernel's last line
	Stalls  []string      // shutdownStalls lines seen during it
}

func (s Shutdown) String() string {
	what := "shutdown"
	if strings.Contains(s.End, "Restarting") {
		what = "reboot"
	}
	if s.Request == "" {
		return fmt.Sprintf("%s (no request line: not timed)", what)
	}
	out := fmt.Sprintf("%s took %s from %q to %q", what, s.Took.Round(100*time.Millisecond), s.Request, s.End)
	if s.Reset > 0 {
		out += fmt.Sprintf("; the firmware's next line %s later", s.Reset.Round(100*time.Millisecond))
	}
	return out
}

// Shutdowns lists the orderly shutdowns of the run: each kernel's last
// line, timed from the last request line before it (and after the shutdown
// before it). A power cut (reset) has no kernel line and is not one.
func (r *Result) Shutdowns() []Shutdown {
	var out []Shutdown
	from := 0 // the first line after the previous shutdown
	for i, l := range r.lines {
		if !containsAny(l, shutdownEnds) {
			continue
		}
		s := Shutdown{End: trimKernelTime(l)}
		req := -1
		for j := from; j < i; j++ {
			if containsAny(r.lines[j], shutdownRequests) {
				req = j
			}
		}
		scan := from
		if req >= 0 {
			s.Request, s.Took, scan = trimKernelTime(r.lines[req]), r.at[i]-r.at[req], req
		}
		for _, l := range r.lines[scan:i] {
			if containsAny(l, shutdownStalls) {
				s.Stalls = append(s.Stalls, l)
			}
		}
		if i+1 < len(r.lines) {
			s.Reset = r.at[i+1] - r.at[i]
		}
		out = append(out, s)
		from = i + 1
	}
	return out
}

// checkShutdowns returns an error naming every shutdown that took longer
// than bound or stalled.
func checkShutdowns(shutdowns []Shutdown, bound time.Duration) error {
	var bad []string
	for n, s := range shutdowns {
		switch {
		case len(s.Stalls) > 0:
			bad = append(bad, fmt.Sprintf("shutdown %d stalled: %q", n+1, s.Stalls))
		case s.Took > bound:
			bad = append(bad, fmt.Sprintf("shutdown %d took %s (bound %s): %s", n+1, s.Took.Round(time.Second), bound, s))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return nil
}

func containsAny(l string, subs []string) bool {
	for _, s := range subs {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// trimKernelTime drops the kernel's "[  144.395686] " timestamp.
func trimKernelTime(l string) string {
	if i := strings.Index(l, "] "); strings.HasPrefix(l, "[") && i > 0 {
		return l[i+2:]
	}
	return l
}
