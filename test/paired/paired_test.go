package paired

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCompare(t *testing.T) {
	t.Parallel()
	calls := 0
	r := Compare(t, 5, func() time.Duration { calls++; return 100 * time.Millisecond },
		func() time.Duration { calls++; return time.Duration(20+calls) * time.Millisecond })
	if calls != 10 || len(r.Ratios) != 5 {
		t.Fatalf("%d calls, %d ratios; want 10, 5", calls, len(r.Ratios))
	}
	for i := 1; i < len(r.Ratios); i++ {
		if r.Ratios[i] < r.Ratios[i-1] {
			t.Fatalf("ratios not sorted: %v", r.Ratios)
		}
	}
	if m := r.Median(); m < 0.2 || m > 0.35 {
		t.Errorf("median %v, want about 0.27", m)
	}
	if MedianDuration([]time.Duration{3, 1, 2}) != 2 || MedianDuration([]time.Duration{4, 1, 3, 2}) != 2 {
		t.Error("MedianDuration")
	}
}

func TestLoadAverage(t *testing.T) {
	t.Parallel()
	if f := strings.Fields(LoadAverage()); len(f) != 3 {
		t.Fatalf("LoadAverage() = %q, want three figures", LoadAverage())
	}
}

func TestThroughput(t *testing.T) {
	r := Result{Ratios: []float64{0.5, 1, 4}}.Throughput()
	if want := []float64{0.25, 1, 2}; !slices.Equal(r.Ratios, want) || r.Median() != 1 {
		t.Fatalf("Throughput of time ratios 0.5, 1, 4 = %v, want %v sorted", r.Ratios, want)
	}
}
