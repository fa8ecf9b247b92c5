// Package vm boots a disk image in QEMU (TCG, UEFI via OVMF, no network) for
// the end-to-end tests, captures the serial console to a log file, scans it
// live, and returns what the guest reported.
//
// Guests report through console lines "KILN-E2E: <name> PASS|FAIL <detail>",
// printed by a check unit that then powers the machine off. Every boot has a
// bound: on timeout, on a failure pattern (kernel panic, emergency mode) or on
// an unexpected QEMU exit the test fails with the last console lines and the
// path of the full log.
package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/e2e/repo"
)

// Firmware files from Debian's ovmf package. The Secure Boot build of the
// code needs SMM (its variable store is only writable from SMM); its
// variables start empty: no PK, the machine in setup mode, as a factory
// machine whose keys the boot loader enrols.
const (
	ovmfCode           = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfSecureBootCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	ovmfVars           = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// CheckPrefix starts every machine-readable result line a guest prints.
const CheckPrefix = "KILN-E2E:"

// DefaultFailOn are console substrings that end a boot at once as failed.
var DefaultFailOn = []string{
	"Kernel panic",
	"emergency mode", // systemd's and dracut's emergency shells
	"Reached target Emergency Mode",
	"Ignition failed", // our own marker, and Ignition's OnFailure path
}

type config struct {
	timeout time.Duration
	memMiB  int
	cpus    int
	failOn  []string
	logDir  string
	name    string
	extra   []string
	monitor bool // a QMP socket and hot-plug ports (WithMonitor, OnConsole)
	reboots bool
	// secureBoot: OVMF's Secure Boot firmware, in setup mode at the start
	secureBoot bool
	hooks      []hook
	prompts    []hook // OnPrompt: matched on the unended console line

	shutdownBound time.Duration // WithShutdownBound
}

// hook is an OnConsole callback.
type hook struct {
	substr string
	fn     func(m *Monitor, line string) error
}

// Option changes how Boot runs QEMU.
type Option func(*config)

// WithTimeout bounds the whole boot, from QEMU start to guest power-off.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithMemory sets the guest RAM in MiB.
func WithMemory(mib int) Option { return func(c *config) { c.memMiB = mib } }

// WithCPUs sets the number of guest CPUs.
func WithCPUs(n int) Option { return func(c *config) { c.cpus = n } }

// WithFailOn adds console substrings that fail the boot as soon as they appear.
func WithFailOn(s ...string) Option { return func(c *config) { c.failOn = append(c.failOn, s...) } }

// WithoutFailOn drops console substrings from the failure patterns, e.g.
// "Kernel panic" for a boot meant to panic (and reboot, with panic=N).
func WithoutFailOn(s ...string) Option {
	return func(c *config) {
		c.failOn = slices.DeleteFunc(c.failOn, func(f string) bool { return slices.Contains(s, f) })
	}
}

// WithLogDir sets where console logs go (default: $KILN_E2E_LOGS, else
// test/e2e/.cache/logs/<test name>). Logs are kept after the test.
func WithLogDir(dir string) Option { return func(c *config) { c.logDir = dir } }

// WithName names this boot in log file names and messages (default "boot").
func WithName(name string) Option { return func(c *config) { c.name = name } }

// WithQEMUArgs appends raw QEMU arguments (e.g. a second -drive).
func WithQEMUArgs(args ...string) Option {
	return func(c *config) { c.extra = append(c.extra, args...) }
}

// WithShutdownBound sets how long each orderly shutdown of the run may take
// (default DefaultShutdownBound); see Result.Shutdowns.
func WithShutdownBound(d time.Duration) Option { return func(c *config) { c.shutdownBound = d } }

// WithReboots lets the guest reboot within the run, and the test press
// reset (Monitor.Reset): each reset ends the QEMU process and the run starts
// a new one on the same disk and UEFI variables, with the disks that were
// plugged in plugged in again, as a machine's reset keeps them; the console
// log holds every boot and Boot returns at the guest's final power-off.
// Implies WithMonitor.
func WithReboots() Option { return func(c *config) { c.reboots, c.monitor = true, true } }

// WithSecureBoot boots with OVMF's Secure Boot firmware (q35 with SMM),
// its variables in setup mode at the start of the run and kept across its
// resets: what the boot loader enrols stays enrolled.
func WithSecureBoot() Option { return func(c *config) { c.secureBoot = true } }

// WithMonitor gives the machine a QMP socket and PCIe root ports for
// hot-plugged disks (see OnConsole).
func WithMonitor() Option { return func(c *config) { c.monitor = true } }

// OnConsole calls fn with the machine's monitor for every console line that
// contains substr (implies WithMonitor). Callbacks run one at a time, in
// console order, beside the console reader (so a slow one never stalls the
// guest's serial port); an error fails the boot.
func OnConsole(substr string, fn func(m *Monitor, line string) error) Option {
	return func(c *config) {
		c.monitor = true
		c.hooks = append(c.hooks, hook{substr, fn})
	}
}

// OnPrompt is OnConsole for a question: fn runs once when the console's
// current, not yet ended line contains substr (a prompt waits for its answer
// without a newline); answer it with m.Type.
func OnPrompt(substr string, fn func(m *Monitor, line string) error) Option {
	return func(c *config) {
		c.monitor = true
		c.prompts = append(c.prompts, hook{substr, fn})
	}
}

// Check is one "KILN-E2E: <name> PASS|FAIL <detail>" console line.
type Check struct {
	Name   string
	Pass   bool
	Detail string
}

// Result is what one boot left on the console.
type Result struct {
	Console  string          // path of the full console log (raw bytes)
	Duration time.Duration   // QEMU start to power-off
	lines    []string        // console lines, escape sequences removed
	at       []time.Duration // when each line arrived, from QEMU start
	restarts int             // the boot started again after an early kernel fault
	boots    []time.Duration // each boot of the run (WithReboots: one per reset), stuck starts included
}

// When returns how long after QEMU started the first console line holding
// substr arrived, and whether one did.
func (r *Result) When(substr string) (time.Duration, bool) {
	for i, l := range r.lines {
		if strings.Contains(l, substr) {
			return r.at[i], true
		}
	}
	return 0, false
}

// Lines returns the console lines that contain prefix, from prefix on.
func (r *Result) Lines(prefix string) []string {
	var out []string
	for _, l := range r.lines {
		if i := strings.Index(l, prefix); i >= 0 {
			out = append(out, l[i:])
		}
	}
	return out
}

// troubleRE matches the console lines that say what went wrong: systemd's
// failed, dependency-failed and timed-out jobs, and failed checks. A new
// boot's "Linux version" line separates the boots.
var troubleRE = regexp.MustCompile(`FAILED\]|DEPEND\]|TIME \]|Failed to start|Dependency failed|[Tt]imed out|KILN-E2E: \S+ FAIL|Linux version`)

// Trouble returns at most max of the console lines troubleRE matches, the
// last ones when there are more.
func (r *Result) Trouble(max int) []string {
	var out []string
	for i, l := range r.lines {
		if troubleRE.MatchString(l) {
			out = append(out, fmt.Sprintf("%7.1fs %s", r.at[i].Seconds(), l))
		}
	}
	return lastN(out, max)
}

// After is the part of the run after the first console line holding
// substr (nothing when none does): the boot after a power cut, say.
func (r *Result) After(substr string) *Result {
	for i, l := range r.lines {
		if strings.Contains(l, substr) {
			return &Result{Console: r.Console, Duration: r.Duration, lines: r.lines[i+1:], at: r.at[i+1:]}
		}
	}
	return &Result{Console: r.Console, Duration: r.Duration}
}

// Until is the part of the run before the first console line holding
// substr (all of it when none does).
func (r *Result) Until(substr string) *Result {
	for i, l := range r.lines {
		if strings.Contains(l, substr) {
			return &Result{Console: r.Console, Duration: r.Duration, lines: r.lines[:i], at: r.at[:i]}
		}
	}
	return r
}

// All returns every console line.
func (r *Result) All() []string { return r.lines }

// Checks parses the KILN-E2E lines. Malformed ones come back as failed
// checks named "malformed" so they cannot go unnoticed.
func (r *Result) Checks() []Check {
	var out []Check
	for _, l := range r.Lines(CheckPrefix) {
		c, err := ParseCheck(l)
		if err != nil {
			c = Check{Name: "malformed", Detail: l}
		}
		out = append(out, c)
	}
	return out
}

// Check returns the last check called name, and whether there was one.
func (r *Result) Check(name string) (Check, bool) {
	var found Check
	ok := false
	for _, c := range r.Checks() {
		if c.Name == name {
			found, ok = c, true
		}
	}
	return found, ok
}

// ParseCheck parses one "KILN-E2E: <name> PASS|FAIL [detail]" line.
func ParseCheck(line string) (Check, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), CheckPrefix)
	if !ok {
		return Check{}, fmt.Errorf("not a %s line: %q", CheckPrefix, line)
	}
	f := strings.SplitN(strings.TrimSpace(rest), " ", 3)
	if len(f) < 2 || (f[1] != "PASS" && f[1] != "FAIL") {
		return Check{}, fmt.Errorf("want %q <name> PASS|FAIL [detail], got %q", CheckPrefix, line)
	}
	c := Check{Name: f[0], Pass: f[1] == "PASS"}
	if len(f) == 3 {
		c.Detail = strings.TrimSpace(f[2])
	}
	return c, nil
}

// Boot boots disk (booted in place: pass a copy) until the guest powers off,
// and returns its console. It fails the test on timeout, on a failure
// pattern, or if QEMU exits with an error.
func Boot(t testing.TB, disk string, opts ...Option) *Result {
	t.Helper()
	res, err := Run(t, disk, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Run is Boot for tests that expect a boot to fail: it returns the error
// (with the console tail and log path) instead of failing the test. The
// Result is non-nil whenever QEMU started.
func Run(t testing.TB, disk string, opts ...Option) (*Result, error) {
	t.Helper()
	c := config{timeout: defaultTimeout(), memMiB: 2048, cpus: defaultCPUs(), name: "boot", shutdownBound: DefaultShutdownBound}
	c.failOn = append(c.failOn, DefaultFailOn...)
	for _, o := range opts {
		o(&c)
	}
	if !machines.scheduled(t.Name()) {
		return nil, fmt.Errorf("vm: %s boots a machine without one of the machine slots: call vm.Schedule first", t.Name())
	}
	if c.logDir == "" {
		c.logDir = defaultLogDir(t)
	}
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return nil, fmt.Errorf("vm: create log dir: %w", err)
	}
	res, err := run(t, disk, c)
	if res != nil {
		record.boot(t.Name(), bootTime{name: bootName(t.Name(), c.name), duration: res.Duration,
			parts: res.boots, restarts: res.restarts, failed: err != nil})
		// CI keeps only the end of the output: a failed test ends with what
		// systemd said went wrong in this run, boot by boot.
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("vm: %s: systemd's failures and kiln's FAIL lines, boot by boot:\n%s", c.name, indent(res.Trouble(60)))
			}
		})
	}
	if err != nil {
		return res, fmt.Errorf("vm: %s of %s: %w", c.name, disk, err)
	}
	t.Logf("vm: %s of %s: powered off after %s (console: %s)", c.name, filepath.Base(disk),
		res.Duration.Round(time.Second), res.Console)
	return res, nil
}

func run(t testing.TB, disk string, c config) (*Result, error) {
	if _, err := os.Stat(disk); err != nil {
		return nil, fmt.Errorf("disk image: %w", err)
	}
	stamp := time.Now().UTC().Format("150405")
	logPath := filepath.Join(c.logDir, fmt.Sprintf("%s-%s-console.log", c.name, stamp))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()

	// UEFI variables are per run; the code is read-only and shared.
	vars := filepath.Join(t.TempDir(), "OVMF_VARS.fd")
	if err := copyFile(vars, ovmfVars); err != nil {
		return nil, fmt.Errorf("copy OVMF variables (is the ovmf package installed?): %w", err)
	}
	machine, code := "q35", ovmfCode
	if c.secureBoot {
		machine, code = "q35,smm=on", ovmfSecureBootCode
	}
	args := []string{
		"-accel", "tcg", "-machine", machine,
		"-m", fmt.Sprint(c.memMiB), "-smp", fmt.Sprint(c.cpus),
		// No default devices (CD-ROM, NIC, VGA): the firmware then tries
		// only our disk, and the guest sees only what a test adds.
		"-nodefaults", "-nographic", "-monitor", "none", "-serial", "stdio",
		"-nic", "none",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + code,
		"-drive", "if=pflash,format=raw,unit=1,file=" + vars,
	}
	if c.secureBoot {
		// Only code running in SMM may write the flash: the OS cannot
		// change the variables behind the firmware's back.
		args = append(args, "-global", "driver=cfi.pflash01,property=secure,value=on")
	}
	if c.monitor {
		// The disk boots first, named by bootindex: OVMF appends the boot
		// option of a disk it finds at a reset (a stick left plugged in)
		// after its UEFI shell, and without a boot order from QEMU it
		// then starts the shell instead of the disk.
		args = append(args, "-drive", "if=none,id=kiln-disk,format=raw,file="+disk,
			"-device", "virtio-blk-pci,drive=kiln-disk,bootindex=0")
	} else {
		args = append(args, "-drive", "if=virtio,format=raw,file="+disk)
	}
	// A reset ends QEMU (-no-reboot, also for a Reset the test presses); with
	// WithReboots the run starts a new QEMU on the same disk and UEFI
	// variables. One process across resets hung in OVMF after a reset in CI
	// runs (QEMU 7.2's TCG: no console byte for 25 and 42 minutes, a second
	// system_reset did not help); a fresh process has never hung there.
	args = append(args, "-no-reboot")
	var qmpPath string
	if c.monitor {
		// A short path: unix socket names are limited to 108 bytes.
		dir, err := os.MkdirTemp("", "kiln-qmp-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		qmpPath = filepath.Join(dir, "qmp.sock")
		// -S: the machine waits for the monitor's "cont", so that disks
		// plugged in at a reset are back before the firmware looks.
		args = append(args, "-S", "-qmp", "unix:"+qmpPath+",server=on,wait=off")
		args = append(args, hotplugArgs()...)
	}
	args = append(args, c.extra...)
	fmt.Fprintf(logFile, "# qemu-system-x86_64 %s\n", strings.Join(args, " "))

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	start := time.Now()
	sc := newScanner(c.failOn, t, c.name)
	sc.start = start
	var mon *Monitor
	var hooks *hookRunner
	if c.monitor {
		mon = newMonitor()
		defer mon.close()
		hooks = newHookRunner(mon, c.hooks, cancel)
		sc.onLine = hooks.line
	}
	var console io.Writer = logFile
	if len(c.prompts) > 0 {
		console = io.MultiWriter(logFile, &promptWatcher{prompts: c.prompts, fire: hooks.queueHook})
	}

	var stderr strings.Builder
	var waitErr error
	stuckRestarts := 0
	var boots []time.Duration
	bootStart := start
	for starts := 1; ; starts++ {
		if starts > 1 && !sc.stuck {
			fmt.Fprintf(logFile, "# the machine reset: qemu-system-x86_64 starts again (%s into the run)\n", time.Since(start).Round(time.Second))
		}
		var again bool
		again, waitErr = c.runQEMU(ctx, cancel, args, qmpPath, mon, hooks, sc, console, &stderr)
		if !(again && sc.stuck) {
			// A stuck start belongs to the boot that follows it.
			boots = append(boots, time.Since(bootStart))
			bootStart = time.Now()
		}
		if again && sc.stuck {
			// The guest kernel got stuck or panicked before init ran (an
			// emulator fault, not the appliance's: nothing on the disks has
			// changed); a third time in one run is a fault of the run.
			if stuckRestarts++; stuckRestarts > 2 {
				sc.failedOn = "the guest kernel " + sc.fault + " before init ran, a third time"
				break
			}
			t.Logf("vm: %s: the guest kernel %s before init ran; QEMU starts this boot again (%d of 2)", c.name, sc.fault, stuckRestarts)
			fmt.Fprintf(logFile, "# the guest kernel %s before init ran: qemu-system-x86_64 starts again (%s into the run)\n", sc.fault, time.Since(start).Round(time.Second))
			continue
		}
		if !again || waitErr != nil || ctx.Err() != nil || sc.failedOn != "" || hooks.failed() {
			break
		}
	}
	hookErr := hooks.stop()
	res := &Result{Console: logPath, Duration: time.Since(start), lines: sc.lines, at: sc.at, restarts: stuckRestarts, boots: boots}

	tail := func() string {
		return fmt.Sprintf("last console lines:\n%s\nfull console log: %s",
			indent(lastN(sc.lines, 60)), logPath)
	}
	switch {
	case hookErr != nil:
		return res, fmt.Errorf("console hook: %w after %s; %s", hookErr, res.Duration.Round(time.Second), tail())
	case sc.failedOn != "":
		return res, fmt.Errorf("console showed %q after %s; %s", sc.failedOn,
			res.Duration.Round(time.Second), tail())
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return res, fmt.Errorf("no power-off within %s (raise it with vm.WithTimeout); %s", c.timeout, tail())
	case waitErr != nil:
		return res, fmt.Errorf("qemu-system-x86_64 failed: %v: %s; %s", waitErr,
			strings.TrimSpace(stderr.String()), tail())
	}
	// Every orderly shutdown is timed, and none may wait out a stop timeout.
	shutdowns := res.Shutdowns()
	for _, s := range shutdowns {
		t.Logf("vm: %s: %s", c.name, s)
	}
	if err := checkShutdowns(shutdowns, c.shutdownBound); err != nil {
		return res, fmt.Errorf("%w; full console log: %s", err, logPath)
	}
	return res, nil
}

// runQEMU runs one QEMU process of the run until it exits, and says
// whether it exited on a reset the run goes on after (WithReboots).
func (c config) runQEMU(ctx context.Context, cancel func(), args []string, qmpPath string, mon *Monitor,
	hooks *hookRunner, sc *scanner, console io.Writer, stderr *strings.Builder) (again bool, err error) {
	if qmpPath != "" {
		os.Remove(qmpPath) // the last QEMU's socket
	}
	pctx, restart := context.WithCancel(ctx)
	defer restart()
	sc.userspace, sc.stuck, sc.restart = false, false, restart
	cmd := exec.CommandContext(pctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return false, err
	}
	// -serial stdio: what a callback types (Monitor.Type) reaches the
	// guest's serial port. Without a monitor stdin stays /dev/null.
	if mon != nil {
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return false, err
		}
		mon.setConsole(stdin)
	}
	stderr.Reset()
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("start qemu-system-x86_64 (is qemu-system-x86 installed?): %w", err)
	}
	if mon != nil {
		err := mon.attach(qmpPath)
		if err == nil {
			err = mon.replug()
		}
		if err == nil {
			_, err = mon.Execute("cont", nil)
		}
		if err != nil {
			cancel()
			cmd.Wait()
			return false, err
		}
	}
	// Scan until the pipe closes: QEMU exited or was killed (timeout, or a
	// failure pattern calling cancel).
	sc.scan(io.TeeReader(stdout, console), cancel)
	hooks.idle() // what this machine's console asked for is done (or failed)
	err = cmd.Wait()
	if sc.stuck && !sc.userspace && ctx.Err() == nil {
		return true, nil // killed before init ran: the same boot, from the start
	}
	if err != nil {
		return false, err
	}
	if mon == nil || !c.reboots {
		return false, nil
	}
	switch r := mon.exitReason(); r {
	case "guest-reset", "host-qmp-system-reset":
		return true, nil
	default:
		return false, nil
	}
}

// scanner splits the console into clean lines and watches for failures.
type scanner struct {
	failOn   []string
	t        testing.TB
	name     string
	lines    []string
	at       []time.Duration
	start    time.Time
	onLine   func(string) // every clean line, if set
	failedOn string

	// The current QEMU process: whether its guest reached userspace, and
	// whether its kernel got stuck or panicked before (see earlyFault).
	userspace, stuck bool
	fault            string // earlyFault's word for the last such fault
	// restart ends the current QEMU process only (set per process).
	restart func()
}

// stuckRE matches the guest kernel's report of a CPU stuck for minutes, not
// the tens of seconds a starved vCPU thread makes it report: QEMU's TCG
// once left a guest kernel spinning in its crypto self-test from its first
// seconds (stuck for 1,568 s when the run's timeout ended it).
var stuckRE = regexp.MustCompile(`soft lockup - CPU#\d+ stuck for (\d{4,}|[2-9]\d\d|1[2-9]\d)s!`)

// earlyFault says how the guest kernel failed before init ran, if line
// shows it did: stuck for minutes (stuckRE), or panicked where a panic is a
// failure (failOn has "Kernel panic"). Under a loaded host TCG starved the
// kernel's IO-APIC timer check at its first instant ("Kernel panic - not
// syncing: IO-APIC + timer doesn't work!"); the fixture boots with
// no_timer_check, and any other panic before init is the emulator's too:
// nothing of the appliance has run yet.
func earlyFault(line string, failOn []string) string {
	switch {
	case stuckRE.MatchString(line):
		return "got stuck"
	case strings.Contains(line, "Kernel panic") && slices.Contains(failOn, "Kernel panic"):
		return "panicked"
	}
	return ""
}

// userspaceRE matches systemd's status lines: init has started, and the
// guest may have written to its disks.
var userspaceRE = regexp.MustCompile(`^\[  OK  \]|^\[FAILED\]|^\[DEPEND\]|^ +Starting |^ +Expecting device`)

func newScanner(failOn []string, t testing.TB, name string) *scanner {
	return &scanner{failOn: failOn, t: t, name: name}
}

// ansi matches terminal escape sequences OVMF and systemd write.
var ansi = regexp.MustCompile(`\x1b(\[[0-9;?=>]*[A-Za-z]|[()][A-Za-z0-9]|[=>c])`)

func (s *scanner) scan(r io.Reader, stop func()) {
	br := bufio.NewReaderSize(r, 64<<10)
	verbose := os.Getenv("KILN_E2E_VERBOSE") != ""
	for {
		raw, err := br.ReadString('\n')
		if raw != "" {
			// One physical line may carry several \r-separated redraws.
			for _, part := range strings.Split(ansi.ReplaceAllString(raw, ""), "\r") {
				l := strings.TrimRight(part, "\n\x00 ")
				if strings.TrimSpace(l) == "" {
					continue
				}
				s.lines = append(s.lines, l)
				s.at = append(s.at, time.Since(s.start))
				if s.onLine != nil {
					s.onLine(l)
				}
				if verbose || strings.Contains(l, CheckPrefix) {
					s.t.Logf("%s| %s", s.name, l)
				}
				if _, name, ok := strings.Cut(l, CheckPrefix+" "); ok {
					name, _, _ = strings.Cut(name, " ")
					record.check(name)
				}
				s.userspace = s.userspace || userspaceRE.MatchString(l)
				// Once init has run, a fault is left to the run's timeout and
				// patterns: at load 8 a starved udev worker reported a 71 s
				// lockup, and recovered.
				if !s.stuck && !s.userspace && s.restart != nil {
					if why := earlyFault(l, s.failOn); why != "" {
						s.stuck, s.fault = true, why
						s.restart() // nothing has run yet: boot again
						continue
					}
				}
				for _, f := range s.failOn {
					if s.failedOn == "" && strings.Contains(l, f) {
						s.failedOn = f
						stop()
					}
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// defaultTimeout is 6 minutes, or $KILN_E2E_BOOT_TIMEOUT (a Go duration) for
// slow machines.
func defaultTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KILN_E2E_BOOT_TIMEOUT")); err == nil && d > 0 {
		return d
	}
	return 6 * time.Minute
}

// defaultCPUs is each guest's CPU count: 2, or $KILN_E2E_CPUS.
func defaultCPUs() int {
	if n, err := strconv.Atoi(os.Getenv("KILN_E2E_CPUS")); err == nil && n > 0 {
		return n
	}
	return 2
}

func defaultLogDir(t testing.TB) string { return filepath.Join(LogRoot(), sanitize(t.Name())) }

// LogRoot is where the run's console logs go, a directory per test:
// $KILN_E2E_LOGS, else test/e2e/.cache/logs in the clone.
func LogRoot() string {
	if d := os.Getenv("KILN_E2E_LOGS"); d != "" {
		return d
	}
	return filepath.Join(repo.Root(), "test", "e2e", ".cache", "logs")
}

// bootName names a boot in the time table: the subtest (if any) and the
// boot's own name.
func bootName(test, boot string) string {
	if _, sub, ok := strings.Cut(test, "/"); ok {
		return sub + ":" + boot
	}
	return boot
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' {
			return '_'
		}
		return r
	}, s)
}

func lastN(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

func indent(lines []string) string {
	return "    " + strings.Join(lines, "\n    ")
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// queued is a callback, or a barrier (idle) that runs even after a failure.
type queued struct {
	fn      func() error
	barrier bool
}

// hookRunner runs OnConsole callbacks in order on a goroutine of its own.
type hookRunner struct {
	hooks []hook
	mon   *Monitor
	queue chan queued
	done  chan struct{}
	mu    sync.Mutex
	err   error
}

func newHookRunner(mon *Monitor, hooks []hook, cancel func()) *hookRunner {
	h := &hookRunner{hooks: hooks, mon: mon, queue: make(chan queued, 256), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for q := range h.queue {
			if h.failed() && !q.barrier {
				continue
			}
			if err := q.fn(); err != nil {
				h.mu.Lock()
				h.err = err
				h.mu.Unlock()
				cancel()
			}
		}
	}()
	return h
}

// failed says whether a callback failed (the run ends).
func (h *hookRunner) failed() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err != nil
}

// idle waits until every callback queued so far has run (or was skipped
// after a failure).
func (h *hookRunner) idle() {
	if h == nil {
		return
	}
	done := make(chan struct{})
	h.queue <- queued{fn: func() error { close(done); return nil }, barrier: true}
	<-done
}

func (h *hookRunner) line(l string) {
	for _, hk := range h.hooks {
		if strings.Contains(l, hk.substr) {
			h.queueHook(hk, l)
		}
	}
}

func (h *hookRunner) queueHook(hk hook, l string) {
	h.queue <- queued{fn: func() error { return hk.fn(h.mon, l) }}
}

// promptWatcher sees the console's raw bytes as they arrive and fires an
// OnPrompt hook once when the line not yet ended contains its substring.
type promptWatcher struct {
	prompts []hook
	fire    func(hook, string)
	tail    []byte // the console since its last newline
	fired   []bool // per prompt, for the current tail
}

func (w *promptWatcher) Write(p []byte) (int, error) {
	if w.fired == nil {
		w.fired = make([]bool, len(w.prompts))
	}
	if i := bytes.LastIndexByte(p, '\n'); i >= 0 {
		w.tail = append(w.tail[:0], p[i+1:]...)
		clear(w.fired)
	} else {
		w.tail = append(w.tail, p...)
	}
	if len(w.tail) == 0 {
		return len(p), nil
	}
	// The last \r-separated redraw, escape sequences removed (as scan).
	parts := strings.Split(ansi.ReplaceAllString(string(w.tail), ""), "\r")
	l := strings.TrimRight(parts[len(parts)-1], "\x00 ")
	for i, pr := range w.prompts {
		if !w.fired[i] && strings.Contains(l, pr.substr) {
			w.fired[i] = true
			w.fire(pr, l)
		}
	}
	return len(p), nil
}

// stop waits for the queued callbacks and returns the first error.
func (h *hookRunner) stop() error {
	if h == nil {
		return nil
	}
	close(h.queue)
	<-h.done
	return h.err
}
