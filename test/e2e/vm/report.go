package vm

// The run's time table: what each test spent, boot by boot, and which tests
// set the run's length. Measured, so that the next change to the suite is
// decided from figures, not guesses (docs/e2e.md keeps the latest table).

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// ledger collects the run's timings and the check names the guests printed.
type ledger struct {
	mu     sync.Mutex
	start  time.Time
	tests  map[string]*testTimes
	checks map[string]bool
	file   string // KeepReport's
}

type testTimes struct {
	name                  string
	asked, granted, ended time.Duration // from the run's start; ended 0 while running
	boots                 []bootTime
	predecessor           string // the test whose slot it got ("" for a first slot)
}

type bootTime struct {
	name     string
	duration time.Duration
	parts    []time.Duration // with reboots: each boot of the run, from QEMU start to its reset or power-off
	restarts int             // QEMU started the same boot again (a kernel stuck or panicked before init)
	failed   bool
}

var record = &ledger{start: time.Now(), tests: map[string]*testTimes{}, checks: map[string]bool{}}

// top is the top-level test of name: slots and boots are charged to it.
func top(name string) string {
	name, _, _ = strings.Cut(name, "/")
	return name
}

func (l *ledger) test(name string) *testTimes {
	tt := l.tests[name]
	if tt == nil {
		tt = &testTimes{name: name}
		l.tests[name] = tt
	}
	return tt
}

func (l *ledger) asked(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tt := l.test(top(name))
	if tt.asked == 0 {
		tt.asked = time.Since(l.start)
	}
}

// granted records that name got the slot predecessor gave back.
func (l *ledger) granted(name, predecessor string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tt := l.test(top(name))
	if tt.granted == 0 {
		tt.granted = time.Since(l.start)
		if predecessor != "" && top(predecessor) != tt.name {
			tt.predecessor = top(predecessor)
		}
	}
}

func (l *ledger) ended(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.test(top(name)).ended = time.Since(l.start)
	if l.file != "" {
		// The table so far, rewritten as each test ends: a run that go
		// test's -timeout ends (no TestMain after it) still leaves one.
		var b strings.Builder
		writeReport(&b, l, time.Since(l.start))
		os.WriteFile(l.file, []byte(b.String()), 0o644)
	}
}

// KeepReport makes the run rewrite its time table to path each time a test
// ends.
func KeepReport(path string) {
	record.mu.Lock()
	defer record.mu.Unlock()
	record.file = path
}

func (l *ledger) boot(test string, b bootTime) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tt := l.test(top(test))
	tt.boots = append(tt.boots, b)
}

func (l *ledger) check(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checks[name] = true
}

// CheckNames returns the distinct names of the checks the guests of this
// run reported (PASS or FAIL), sorted.
func CheckNames() []string {
	record.mu.Lock()
	defer record.mu.Unlock()
	return slices.Sorted(maps.Keys(record.checks))
}

// WriteReport writes the run's time table to w: per test its slot time,
// its share of all slot time, its wait for a slot and each boot; then the
// critical path (the chain of tests, each started in the slot the one
// before it gave back, that ends with the last test) and the number of
// distinct check names.
func WriteReport(w io.Writer) {
	record.mu.Lock()
	defer record.mu.Unlock()
	writeReport(w, record, time.Since(record.start))
}

func writeReport(w io.Writer, l *ledger, wall time.Duration) {
	var tests []*testTimes
	all := map[string]*testTimes{}
	var machine time.Duration
	for name, t := range l.tests {
		if t.granted == 0 {
			continue
		}
		tt := *t // a copy: the ledger goes on
		if tt.ended == 0 {
			tt.ended = wall // still running (or a run that timed out)
			tt.name += " (running)"
		}
		tests = append(tests, &tt)
		all[name] = &tt
		machine += tt.ended - tt.granted
	}
	sort.Slice(tests, func(i, j int) bool {
		return tests[i].ended-tests[i].granted > tests[j].ended-tests[j].granted
	})
	fmt.Fprintf(w, "== e2e time table: %s wall, %s of machine slots, %d tests\n",
		round(wall), round(machine), len(tests))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "test\tslot time\tshare\twaited\tstart\tend\tboots (name time)")
	for _, tt := range tests {
		d := tt.ended - tt.granted
		share := 0.0
		if machine > 0 {
			share = 100 * float64(d) / float64(machine)
		}
		var boots []string
		for _, b := range tt.boots {
			s := b.name + " " + round(b.duration)
			if len(b.parts) > 1 {
				var ps []string
				for _, p := range b.parts {
					ps = append(ps, round(p))
				}
				s += " [" + strings.Join(ps, " ") + "]"
			}
			if b.restarts > 0 {
				s += fmt.Sprintf(" (started %d more times)", b.restarts)
			}
			if b.failed {
				s += " (failed)"
			}
			boots = append(boots, s)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f %%\t%s\t%s\t%s\t%d: %s\n", tt.name, round(d), share,
			round(tt.granted-tt.asked), round(tt.granted), round(tt.ended), len(tt.boots), strings.Join(boots, ", "))
	}
	tw.Flush()
	if path := criticalPath(all, tests); len(path) > 0 {
		var parts []string
		for _, tt := range path {
			parts = append(parts, fmt.Sprintf("%s %s", tt.name, round(tt.ended-tt.granted)))
		}
		first := path[0].granted
		fmt.Fprintf(w, "critical path: %s before the first slot, then %s (%s)\n",
			round(first), strings.Join(parts, " -> "), round(path[len(path)-1].ended-first))
	}
	fmt.Fprintf(w, "== e2e checks: %d distinct KILN-E2E check names reported by the guests\n", len(l.checks))
}

// criticalPath is the chain that set the run's length: the test that ended
// last, the test whose slot it got, and so on back to a test that got one
// of the first slots.
func criticalPath(all map[string]*testTimes, tests []*testTimes) []*testTimes {
	var last *testTimes
	for _, tt := range tests {
		if last == nil || tt.ended > last.ended {
			last = tt
		}
	}
	var path []*testTimes
	for tt := last; tt != nil && len(path) <= len(all); tt = all[tt.predecessor] {
		path = append([]*testTimes{tt}, path...)
		if tt.predecessor == "" {
			break
		}
	}
	return path
}

func round(d time.Duration) string {
	if d >= 10*time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}
