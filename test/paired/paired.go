// Package paired measures a candidate against a baseline on a noisy machine:
// the two run alternately, each pair in the same moment, and what is reported
// is the ratio of each pair, as median and range over the runs. A single
// timing means little here; the spread says how much the median can be trusted.
package paired

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

// Runs is the number of pairs Compare measures unless told otherwise: the
// issue's "at least 5 paired runs".
const Runs = 5

// Result is the pairs' timings and their ratios (candidate / baseline).
type Result struct {
	Baseline, Candidate []time.Duration
	Ratios              []float64 // sorted
}

// Median of the ratios.
func (r Result) Median() float64 {
	n := len(r.Ratios)
	if n%2 == 1 {
		return r.Ratios[n/2]
	}
	return (r.Ratios[n/2-1] + r.Ratios[n/2]) / 2
}

// String reads "median 0.42 (0.38–0.51) over 5 pairs".
func (r Result) String() string {
	return fmt.Sprintf("median %.3g (%.3g–%.3g) over %d pairs", r.Median(), r.Ratios[0], r.Ratios[len(r.Ratios)-1], len(r.Ratios))
}

// Compare runs baseline and candidate runs times each, alternating which
// goes first, and returns the ratios candidate/baseline. Each function
// returns the duration it measured (setup outside it is not counted).
func Compare(b testing.TB, runs int, baseline, candidate func() time.Duration) Result {
	b.Helper()
	var r Result
	for i := 0; i < runs; i++ {
		var tb, tc time.Duration
		if i%2 == 0 {
			tb, tc = baseline(), candidate()
		} else {
			tc, tb = candidate(), baseline()
		}
		r.Baseline = append(r.Baseline, tb)
		r.Candidate = append(r.Candidate, tc)
		r.Ratios = append(r.Ratios, tc.Seconds()/tb.Seconds())
	}
	sort.Float64s(r.Ratios)
	return r
}

// Report adds the median and range to a benchmark's output under name
// (e.g. "kiln/dist"), so `go test -bench` prints them on its result line.
func Report(b *testing.B, name string, r Result) {
	b.ReportMetric(r.Median(), name+"-median")
	b.ReportMetric(r.Ratios[0], name+"-min")
	b.ReportMetric(r.Ratios[len(r.Ratios)-1], name+"-max")
}

// MedianDuration is the median of ds.
func MedianDuration(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// LoadAverage is the machine's 1, 5 and 15 minute load averages as
// /proc/loadavg gives them ("2.51 3.02 2.87"), to record beside a figure:
// on a shared machine it says how much the figure can be trusted.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Throughput turns time ratios (candidate / baseline) into throughput ratios
// (baseline time over candidate time: above 1, the candidate is faster),
// still sorted.
func (r Result) Throughput() Result {
	t := Result{Baseline: r.Baseline, Candidate: r.Candidate, Ratios: make([]float64, len(r.Ratios))}
	for i, x := range r.Ratios {
		t.Ratios[len(r.Ratios)-1-i] = 1 / x
	}
	return t
}

// BlankLoop attaches a fresh, blank loop device of size bytes backed by file
// (replaced if it exists) and returns it with its detach: a write target
// that starts empty in every run.
func BlankLoop(tb testing.TB, file string, size int64) (dev string, detach func()) {
	tb.Helper()
	os.Remove(file)
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).Output()
	if err != nil {
		tb.Fatalf("losetup %s: %v", file, err)
	}
	dev = strings.TrimSpace(string(out))
	return dev, func() { exec.Command("losetup", "--detach", dev).Run() }
}
