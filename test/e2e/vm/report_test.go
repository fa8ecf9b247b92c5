package vm

import (
	"strings"
	"testing"
	"time"
)

// The table lists every test that had a slot, longest first, with its
// boots; the critical path follows the slots back from the test that ended
// last; the count is of distinct check names.
func TestWriteReport(t *testing.T) {
	s := time.Second
	l := &ledger{tests: map[string]*testTimes{
		"TestLong":   {name: "TestLong", asked: 1 * s, granted: 3 * s, ended: 600 * s, boots: []bootTime{{name: "first-boot", duration: 200 * s}, {name: "second-boot", duration: 150 * s, restarts: 1}, {name: "reboots", duration: 500 * s, parts: []time.Duration{200 * s, 300 * s}}}},
		"TestShort":  {name: "TestShort", asked: 1 * s, granted: 3 * s, ended: 100 * s},
		"TestAfter":  {name: "TestAfter", asked: 1 * s, granted: 100 * s, ended: 400 * s, predecessor: "TestShort"},
		"TestLast":   {name: "TestLast", asked: 1 * s, granted: 400 * s, ended: 700 * s, predecessor: "TestAfter", boots: []bootTime{{name: "x:boot", duration: 290 * s, failed: true}}},
		"TestWaited": {name: "TestWaited", asked: 2 * s}, // never got a slot: not in the table
	}, checks: map[string]bool{"a": true, "b": true, "c": true}}
	var b strings.Builder
	writeReport(&b, l, 710*s)
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"11m50s wall, 21m34s of machine slots, 4 tests",
		"TestLast   5m0s       23.2 %  6m39s",
		"3: first-boot 3m20s, second-boot 2m30s (started 1 more times), reboots 8m20s [3m20s 5m0s]",
		"1: x:boot 4m50s (failed)",
		"critical path: 3s before the first slot, then TestShort 1m37s -> TestAfter 5m0s -> TestLast 5m0s (11m37s)",
		"3 distinct KILN-E2E check names",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	l.tests["TestRunning"] = &testTimes{name: "TestRunning", asked: s, granted: 600 * s}
	b.Reset()
	writeReport(&b, l, 710*s)
	if !strings.Contains(b.String(), "TestRunning (running)  1m50s") {
		t.Errorf("a running test is not in the table up to now:\n%s", b.String())
	}
	if l.tests["TestRunning"].ended != 0 {
		t.Error("writing the table ended a running test in the ledger")
	}
	if strings.Contains(out, "TestWaited") {
		t.Error("a test that never got a slot is in the table")
	}
	if i, j := strings.Index(out, "TestLong"), strings.Index(out, "TestShort"); i > j {
		t.Error("the table is not longest first")
	}
}

// A predecessor cycle (impossible in a run, but the walk must end) stops.
func TestCriticalPathEnds(t *testing.T) {
	all := map[string]*testTimes{
		"A": {name: "A", granted: 1, ended: 10, predecessor: "B"},
		"B": {name: "B", granted: 1, ended: 5, predecessor: "A"},
	}
	if p := criticalPath(all, []*testTimes{all["A"], all["B"]}); len(p) == 0 || len(p) > 3 {
		t.Errorf("path of %d tests", len(p))
	}
}
