package progress

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock drives a text Reporter's time by hand; its ticker is off, so
// the test calls tick when the clock says so.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newFake(b *strings.Builder, terminal bool, opts ...Option) (*text, *fakeClock) {
	c := &fakeClock{t: time.Unix(0, 0)}
	r := New(b, terminal, opts...).(*text)
	r.now, r.noTicker = c.now, true
	return r, c
}

func TestLogLines(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	r, clock := newFake(&b, false)
	task := r.Task("fetch quay.io/acme/app:1.2", 2<<20)
	task.Write(make([]byte, 2<<20))
	clock.advance(2 * time.Second)
	task.Done(nil)
	want := "fetch quay.io/acme/app:1.2: started (2.0 MiB)\nfetch quay.io/acme/app:1.2: done, 2.0 MiB in 2s (1.0 MiB/s)\n"
	if b.String() != want {
		t.Fatalf("got\n%q\nwant\n%q", b.String(), want)
	}
}

func TestTerminalRedrawsInPlace(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	r, clock := newFake(&b, true)
	task := r.Task("stage", 100)
	clock.advance(time.Second)
	task.Write(make([]byte, 50))
	if !strings.Contains(b.String(), "stage: 50 B of 100 B (50%), 50 B/s, about 1s left") {
		t.Fatalf("no status line: %q", b.String())
	}
	task.Done(nil)
	if !strings.Contains(b.String(), "\r") || !strings.HasSuffix(b.String(), "stage: done, 50 B of 100 B in 1s (50 B/s)\n") {
		t.Fatalf("line not cleared before the done line: %q", b.String())
	}
}

// The status line of a running task: bytes of the total, rate, time left.
func TestStatusLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		done, total int64
		elapsed     time.Duration
		want        string
	}{
		{0, 0, 20 * time.Second, "x: running for 20s"},
		{0, 4 << 20, 10 * time.Second, "x: 0 B of 4.0 MiB (0%), 0 B/s"}, // no rate, no time left
		{1 << 20, 4 << 20, time.Second, "x: 1.0 MiB of 4.0 MiB (25%), 1.0 MiB/s, about 3s left"},
		{100 << 20, 1500 << 20, 10 * time.Second, "x: 100.0 MiB of 1.5 GiB (6%), 10.0 MiB/s, about 2m20s left"},
		{1 << 20, 1 << 30, 10 * time.Second, "x: 1.0 MiB of 1.0 GiB (0%), 102.4 KiB/s, about 2h50m left"},
		{4 << 20, 4 << 20, 2 * time.Second, "x: 4.0 MiB of 4.0 MiB (100%), 2.0 MiB/s"}, // nothing left
		{5 << 20, 0, 5 * time.Second, "x: 5.0 MiB, 1.0 MiB/s"},                         // no total, no time left
		{5 << 20, 4 << 20, 5 * time.Second, "x: 5.0 MiB of 4.0 MiB (125%), 1.0 MiB/s"}, // past its total
	} {
		if got := statusLine("x", tc.done, tc.total, tc.elapsed); got != tc.want {
			t.Errorf("statusLine(%d, %d, %v) = %q, want %q", tc.done, tc.total, tc.elapsed, got, tc.want)
		}
	}
}

// The done line reports the started line's quantity, or both when they
// differ; an interrupted task says so in those words.
func TestDoneLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		done, total int64
		err         error
		want        string
	}{
		{2 << 20, 2 << 20, nil, "x: done, 2.0 MiB in 2s (1.0 MiB/s)"},
		{407, 1536 << 10, nil, "x: done, 407 B of 1.5 MiB in 2s (203 B/s)"},
		{27237376, 27262976, nil, "x: done, 26.0 MiB in 2s (13.0 MiB/s)"}, // equal as printed
		{2 << 20, 0, nil, "x: done, 2.0 MiB in 2s (1.0 MiB/s)"},
		{0, 0, nil, "x: done in 2s"},
		{0, 1 << 20, nil, "x: done in 2s"},
		{1 << 20, 2 << 20, errors.New("disk full"), "x: failed after 2s: disk full"},
		{1 << 20, 2 << 20, context.Canceled, "x: interrupted after 2s"},
		{1 << 20, 2 << 20, fmt.Errorf("fetch blob sha256:ab: %w", context.Canceled), "x: interrupted after 2s"},
	} {
		if got := doneLine("x", tc.done, tc.total, 2*time.Second, tc.err); got != tc.want {
			t.Errorf("doneLine(%d, %d, %v) = %q, want %q", tc.done, tc.total, tc.err, got, tc.want)
		}
	}
}

func TestClock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"}, {1499 * time.Millisecond, "1s"}, {59 * time.Second, "59s"}, {61 * time.Second, "1m01s"},
		{59*time.Minute + 59*time.Second, "59m59s"}, {time.Hour, "1h00m"}, {26*time.Hour + 5*time.Minute + 40*time.Second, "26h05m"},
	} {
		if got := clock(tc.d); got != tc.want {
			t.Errorf("clock(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// Every's lines come at its interval, from the work's writes and from the
// clock alone (a stalled task too), one per task, the oldest first; a
// terminal gets no log lines, its status line is redrawn instead.
func TestEveryInterval(t *testing.T) {
	t.Parallel()
	// a starts at 0 s, b at 1 s; at each time, a's bytes (0: the clock ticks).
	steps := []struct {
		at    time.Duration
		write int
	}{
		{1500 * time.Millisecond, 1 << 20}, // too soon for a line
		{2 * time.Second, 1 << 20},         // a's line
		{3 * time.Second, 2 << 20},         // a's last line too recent, b's due
		{4 * time.Second, 0},               // a's line from the clock
		{5500 * time.Millisecond, 0},       // b's: stalled
		{6 * time.Second, 0},               // a's: stalled
		{8 * time.Second, 0},               // both, a first
	}
	for _, tc := range []struct {
		terminal bool
		want     string
	}{
		{false, "a: started (8.0 MiB)\n" +
			"b: started (1.0 MiB)\n" +
			"a: 2.0 MiB of 8.0 MiB (25%), 1.0 MiB/s, about 6s left\n" +
			"b: 0 B of 1.0 MiB (0%), 0 B/s\n" +
			"a: 4.0 MiB of 8.0 MiB (50%), 1.0 MiB/s, about 4s left\n" +
			"b: 0 B of 1.0 MiB (0%), 0 B/s\n" +
			"a: 4.0 MiB of 8.0 MiB (50%), 682.7 KiB/s, about 6s left\n" +
			"a: 4.0 MiB of 8.0 MiB (50%), 512.0 KiB/s, about 8s left\n" +
			"b: 0 B of 1.0 MiB (0%), 0 B/s\n" +
			"b: done in 7s\n" +
			"a: done, 4.0 MiB of 8.0 MiB in 8s (512.0 KiB/s)\n"},
		// The last redraw, at 8 s, before anything ended.
		{true, "a (+1 more): 4.0 MiB of 9.0 MiB (44%), 512.0 KiB/s, about 10s left"},
	} {
		var b strings.Builder
		r, clock := newFake(&b, tc.terminal, Every(2*time.Second))
		start := clock.now()
		a := r.Task("a", 8<<20)
		clock.advance(time.Second)
		bt := r.Task("b", 1<<20)
		for _, s := range steps {
			clock.t = start.Add(s.at)
			if s.write > 0 {
				a.Write(make([]byte, s.write))
			} else {
				r.mu.Lock()
				r.tick(clock.now())
				r.mu.Unlock()
			}
		}
		if tc.terminal {
			if strings.Contains(b.String(), "\n") {
				t.Errorf("terminal: log lines while tasks run: %q", b.String())
			}
			if got := b.String()[strings.LastIndex(b.String(), "\r")+1:]; got != tc.want {
				t.Errorf("terminal: last status line %q, want %q", got, tc.want)
			}
			continue
		}
		bt.Done(nil)
		a.Done(nil)
		if b.String() != tc.want {
			t.Errorf("log lines:\ngot\n%s\nwant\n%s", b.String(), tc.want)
		}
	}
}

// syncBuffer is written by the ticker's goroutine and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A task that writes nothing still gets its lines, from a real clock, and
// none after it ends.
func TestEveryTicksWithoutWrites(t *testing.T) {
	t.Parallel()
	var b syncBuffer
	task := New(&b, false, Every(10*time.Millisecond)).Task("read the base", 0)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), "read the base: running for 0s\n") {
		if time.Now().After(deadline) {
			t.Fatalf("no progress line from the clock in 10s: %q", b.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	task.Done(nil)
	ended := b.String()
	time.Sleep(50 * time.Millisecond)
	if after := b.String(); after != ended {
		t.Fatalf("lines after the task ended: %q", strings.TrimPrefix(after, ended))
	}
	lines := strings.Split(strings.TrimSuffix(ended, "\n"), "\n")
	if !strings.HasPrefix(lines[len(lines)-1], "read the base: done in ") {
		t.Fatalf("no done line last: %q", ended)
	}
}
