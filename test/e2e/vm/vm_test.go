package vm

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCheck(t *testing.T) {
	tests := []struct {
		line    string
		want    Check
		wantErr bool
	}{
		{"KILN-E2E: hello-file PASS", Check{Name: "hello-file", Pass: true}, false},
		{"KILN-E2E: boot PASS n=2", Check{Name: "boot", Pass: true, Detail: "n=2"}, false},
		{"  KILN-E2E: podman FAIL podman: not found  ", Check{Name: "podman", Detail: "podman: not found"}, false},
		{"KILN-E2E: x OK", Check{}, true},
		{"KILN-E2E: lonely", Check{}, true},
		{"hello KILN-E2E: x PASS", Check{}, true},
	}
	for _, tt := range tests {
		got, err := ParseCheck(tt.line)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseCheck(%q) = %+v, %v; want %+v, err=%v", tt.line, got, err, tt.want, tt.wantErr)
		}
	}
}

// The scanner must cope with what OVMF and systemd really print: ANSI
// escapes, CR redraws, checks in the middle of a line, and stop at once on a
// failure pattern.
func TestScanner(t *testing.T) {
	console := "\x1b[=3h\x1b[2J\x1b[01;01HBdsDxe: loading Boot0001\r\n" +
		"[  OK  ] Started \x1b[0;1;39mkiln e2e checks\x1b[0m.\r\n" +
		"\r[   12.3] kiln-e2e-check[301]: KILN-E2E: boot PASS n=1\r\n" +
		"KILN-E2E: broken\n" +
		"You are in emergency mode. After logging in...\n" +
		"KILN-E2E: late PASS\n"
	stopped := 0
	s := newScanner(DefaultFailOn, t, "test")
	s.scan(strings.NewReader(console), func() { stopped++ })
	r := &Result{lines: s.lines}
	if s.failedOn != "emergency mode" || stopped != 1 {
		t.Errorf("failedOn = %q (stop called %d times), want %q once", s.failedOn, stopped, "emergency mode")
	}
	if got := r.Lines("BdsDxe"); len(got) != 1 || got[0] != "BdsDxe: loading Boot0001" || s.lines[0] != got[0] {
		t.Errorf("firmware line = %q (first line %q)", got, s.lines[0])
	}
	if got := r.Lines("[  OK  ]"); len(got) != 1 || got[0] != "[  OK  ] Started kiln e2e checks." {
		t.Errorf("escape sequences not stripped: %q", got)
	}
	checks := r.Checks()
	want := []Check{
		{Name: "boot", Pass: true, Detail: "n=1"},
		{Name: "malformed", Detail: "KILN-E2E: broken"},
		{Name: "late", Pass: true},
	}
	if len(checks) != len(want) {
		t.Fatalf("checks = %+v, want %+v", checks, want)
	}
	for i := range want {
		if checks[i] != want[i] {
			t.Errorf("check %d = %+v, want %+v", i, checks[i], want[i])
		}
	}
}

// WithoutFailOn lets a boot meant to panic go on past the panic, and only
// drops what it names.
func TestWithoutFailOn(t *testing.T) {
	c := config{failOn: append([]string{}, DefaultFailOn...)}
	WithoutFailOn("Kernel panic")(&c)
	stopped := 0
	s := newScanner(c.failOn, t, "test")
	s.scan(strings.NewReader("Kernel panic - not syncing: Attempted to kill init!\nRebooting in 5 seconds..\n"+
		"You are in emergency mode.\n"), func() { stopped++ })
	if s.failedOn != "emergency mode" || stopped != 1 || len(s.lines) != 3 {
		t.Errorf("failedOn = %q (stop called %d times, %d lines), want %q once, after the panic's lines",
			s.failedOn, stopped, len(s.lines), "emergency mode")
	}
}

// A guest kernel stuck for minutes, or panicked, before init ran restarts
// the boot; once init ran, or for a lockup of tens of seconds (a starved
// vCPU thread), the scanner does nothing about a lockup (the run's timeout
// bounds it), and a panic fails the boot. A boot that expects a panic (no
// "Kernel panic" among its failure patterns) is never restarted for one.
func TestScannerStuckKernel(t *testing.T) {
	starved := "[   32.56] watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [kworker/0:1:12]\n"
	stuck := "[  160.56] watchdog: BUG: soft lockup - CPU#0 stuck for 130s! [cryptomgr_test:51]\n" +
		"[ 1688.56] watchdog: BUG: soft lockup - CPU#0 stuck for 1568s! [cryptomgr_test:51]\n"
	timerPanic := "[    0.41] Kernel panic - not syncing: IO-APIC + timer doesn't work!  Boot with apic=debug\n"
	initPanic := "kiln-e2e: this initramfs cannot boot the system\n[    4.20] Kernel panic - not syncing: Attempted to kill init!\n"
	noPanicFail := slices.DeleteFunc(slices.Clone(DefaultFailOn), func(f string) bool { return f == "Kernel panic" })
	for _, tt := range []struct {
		name            string
		failOn          []string
		console         string
		restarts, stops int
		failedOn        string
	}{
		{"before init", DefaultFailOn, "BdsDxe: starting Boot0001\n" + starved + stuck, 1, 0, ""},
		{"after init", DefaultFailOn, "[  OK  ] Reached target local-fs.target\n" + stuck, 0, 0, ""},
		{"starved only", DefaultFailOn, "BdsDxe: starting Boot0001\n" + starved + "[  OK  ] Started x.\n" + starved, 0, 0, ""},
		{"panic before init", DefaultFailOn, "BdsDxe: starting Boot0001\n" + timerPanic, 1, 0, ""},
		{"panic after init", DefaultFailOn, "[  OK  ] Reached target local-fs.target\n" + timerPanic, 0, 1, "Kernel panic"},
		{"panic expected", noPanicFail, "BdsDxe: starting Boot0001\n" + initPanic, 0, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			restarts, stops := 0, 0
			s := newScanner(tt.failOn, t, "test")
			s.restart = func() { restarts++ }
			s.scan(strings.NewReader(tt.console), func() { stops++ })
			if restarts != tt.restarts || stops != tt.stops || s.failedOn != tt.failedOn {
				t.Errorf("restarts %d, stops %d, failedOn %q; want %d, %d, %q", restarts, stops, s.failedOn, tt.restarts, tt.stops, tt.failedOn)
			}
		})
	}
}

// A prompt waits on an unended line, may arrive in pieces and in colour, and
// is answered once; the same words on a later line are a new prompt.
func TestPromptWatcher(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   []string
	}{
		{"whole", []string{"boot\nkiln: type \"yes\" and press Enter: "}, []string{`kiln: type "yes" and press Enter:`}},
		{"in pieces", []string{"boot\nkiln: ty", "pe \"y", "es\" and press Enter: "}, []string{`kiln: type "yes" and press Enter:`}},
		{"escapes and redraw", []string{"x\r\x1b[0mkiln: type \x1b[1m\"yes\"\x1b[0m: "}, []string{`kiln: type "yes":`}},
		{"once per line", []string{"type \"yes\": ", "y", "es"}, []string{`type "yes":`}},
		{"again on a new line", []string{"type \"yes\": ", "no\n", "type \"yes\": "}, []string{`type "yes":`, `type "yes":`}},
		{"an ended line is not a prompt", []string{"type \"yes\" or not\n", "next"}, nil},
		{"no prompt", []string{"hello\n", "world"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			w := &promptWatcher{prompts: []hook{{substr: `type "yes"`}},
				fire: func(_ hook, l string) { got = append(got, l) }}
			for _, s := range tt.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("fired %q, want %q", got, tt.want)
			}
		})
	}
}

// After and Until cut a run of several boots at a marker line.
func TestAfterUntil(t *testing.T) {
	r := &Result{lines: []string{"fw", "KILN-E2E: x PASS", "cut here", "fw", "KILN-E2E: x FAIL"}}
	r.at = make([]time.Duration, len(r.lines))
	first, second := r.Until("cut here"), r.After("cut here")
	if c, ok := first.Check("x"); !ok || !c.Pass {
		t.Errorf("first boot's x: %+v %v", c, ok)
	}
	if c, ok := second.Check("x"); !ok || c.Pass {
		t.Errorf("second boot's x: %+v %v", c, ok)
	}
	if n := len(r.After("n=3").All()); n != 0 {
		t.Errorf("After a marker never seen: %d lines", n)
	}
	if n := len(second.All()); n != 2 {
		t.Errorf("After the marker: %d lines, want 2", n)
	}
	if n := len(r.Until("n=3").All()); n != len(r.lines) {
		t.Errorf("Until a marker never seen: %d lines", n)
	}
}

// Trouble keeps systemd's failures, kiln's failed checks and the boot
// separators, and only the last ones.
func TestTrouble(t *testing.T) {
	r := &Result{lines: []string{
		"[    0.000000] Linux version 6.1.0",
		"[  OK  ] Started crio.service",
		"[ TIME ] Timed out waiting for device dev-disk-by…",
		"[DEPEND] Dependency failed for kiln…inish interrupted release changes.",
		"kiln-e2e-check[5]: KILN-E2E: b3-settled PASS",
		"kiln-e2e-check[5]: KILN-E2E: b3-current FAIL want 1.2.0",
	}}
	r.at = []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second}
	got := r.Trouble(10)
	want := []string{
		"    0.0s [    0.000000] Linux version 6.1.0",
		"    2.0s [ TIME ] Timed out waiting for device dev-disk-by…",
		"    3.0s [DEPEND] Dependency failed for kiln…inish interrupted release changes.",
		"    5.0s kiln-e2e-check[5]: KILN-E2E: b3-current FAIL want 1.2.0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Trouble(10):\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := r.Trouble(2); len(got) != 2 || !strings.Contains(got[1], "b3-current FAIL") {
		t.Errorf("Trouble(2) = %q, want the last two", got)
	}
}

// Shutdowns are timed from the request line before the kernel's last line,
// and a stop job waiting out its timeout, a failed unmount or kiln's image
// partition alarm during one fails the run; a power cut is not a shutdown.
func TestShutdowns(t *testing.T) {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	r := &Result{
		lines: []string{
			"KILN-E2E: boot PASS n=1",
			"KILN-E2E-SHUTDOWN: reboot requested",
			"[  OK  ] Stopped crio.service",
			"[  144.395686] reboot: Restarting system",
			"BdsDxe: loading Boot0001",
			"KILN-E2E: boot PASS n=2", // a power cut follows: no kernel line
			"BdsDxe: loading Boot0001",
			"kiln: release 1.3.0 failed its health check: …; rolled back to 1.2.0",
			"[ *** ] A stop job is running for crio.service (12s / 1min 30s)",
			"[FAILED] Failed unmounting var-lib-kiln-images.mount",
			"[   99.1] reboot: Restarting system",
			"BdsDxe: loading Boot0001",
			"[   33.2] reboot: Power down",
		},
		at: []time.Duration{0, sec(10), sec(11), sec(14), sec(20), sec(30), sec(40), sec(50), sec(60), sec(130), sec(150), sec(160), sec(190)},
	}
	got := r.Shutdowns()
	if len(got) != 3 {
		t.Fatalf("Shutdowns() = %+v, want 3", got)
	}
	if g := got[0]; g.Request != "KILN-E2E-SHUTDOWN: reboot requested" || g.Took != sec(4) || g.Reset != sec(6) ||
		g.End != "reboot: Restarting system" || len(g.Stalls) != 0 {
		t.Errorf("first: %+v", g)
	}
	if g := got[1]; g.Took != sec(100) || len(g.Stalls) != 2 {
		t.Errorf("second (rollback reboot): %+v", g)
	}
	if g := got[2]; g.Request != "" || g.Reset != 0 || len(g.Stalls) != 0 {
		t.Errorf("third (no request): %+v", g)
	}
	err := checkShutdowns(got, DefaultShutdownBound)
	if err == nil || !strings.Contains(err.Error(), "shutdown 2 stalled") || strings.Contains(err.Error(), "shutdown 1") {
		t.Errorf("checkShutdowns: %v, want only shutdown 2 stalled", err)
	}
	if err := checkShutdowns(got[:1], sec(3)); err == nil || !strings.Contains(err.Error(), "took 4s (bound 3s)") {
		t.Errorf("checkShutdowns over the bound: %v", err)
	}
	if err := checkShutdowns(got[:1], DefaultShutdownBound); err != nil {
		t.Errorf("checkShutdowns of a clean reboot: %v", err)
	}
}
