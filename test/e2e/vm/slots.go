package vm

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The machines share the host's cores, so at most a few run at once. Go's
// -parallel would bound them too, but it starts waiting tests in no useful
// order: the longest scenario could start last and run alone at the end,
// two of three slots idle. Schedule hands the slots out longest first (the
// classic longest-processing-time rule), which keeps the end of the run
// short; Go's -parallel is then set above the number of scenarios.

// gather is how long the first slots wait for the other scenarios to ask:
// Go releases every parallel test at once, so they all ask within it.
const gather = 2 * time.Second

type slots struct {
	mu      sync.Mutex
	free    int
	opens   time.Time // no slot is handed out before: see gather
	waiting []*waiter // longest first
	holders map[string]bool
	freedBy []string // who gave back the free slots, for the time table
}

type waiter struct {
	expected time.Duration
	ready    chan struct{}
	from     string // the test whose slot it got
}

var machines = &slots{free: machineCount(), holders: map[string]bool{}}

// machineCount is $KILN_E2E_MACHINES (the Makefile's E2E_PARALLEL), or 2:
// two guests keep the 2-core machine busy; a third oversubscribes it.
func machineCount() int {
	if n, err := strconv.Atoi(os.Getenv("KILN_E2E_MACHINES")); err == nil && n > 0 {
		return n
	}
	return 2
}

// Schedule makes t a parallel test that runs once one of the machine slots
// is free, and holds that slot until t ends. expected is how long t takes
// on a loaded machine: only the order depends on it. Every test that boots
// a machine (or one of its ancestors) calls Schedule first; a test that
// holds a slot must not start subtests that ask for one.
func Schedule(t *testing.T, expected time.Duration) {
	t.Helper()
	t.Parallel()
	t.Cleanup(Hold(t, expected))
}

// Hold waits for a machine slot for a part of a parallel test (building
// what its subtests share, say) and returns the function that gives it back.
func Hold(t testing.TB, expected time.Duration) (release func()) {
	machines.acquire(t.Name(), expected)
	var once sync.Once
	return func() { once.Do(func() { machines.release(t.Name()) }) }
}

func (s *slots) acquire(name string, expected time.Duration) {
	record.asked(name)
	w := &waiter{expected: expected, ready: make(chan struct{})}
	s.mu.Lock()
	if s.opens.IsZero() {
		s.opens = time.Now().Add(gather)
		time.AfterFunc(gather, s.dispatch)
	}
	i, _ := slices.BinarySearchFunc(s.waiting, w, func(a, b *waiter) int { return int(b.expected - a.expected) })
	s.waiting = slices.Insert(s.waiting, i, w)
	s.mu.Unlock()
	s.dispatch()
	<-w.ready
	record.granted(name, w.from)
	s.mu.Lock()
	s.holders[name] = true
	s.mu.Unlock()
}

func (s *slots) release(name string) {
	s.mu.Lock()
	delete(s.holders, name)
	s.free++
	s.freedBy = append(s.freedBy, name)
	s.mu.Unlock()
	record.ended(name)
	s.dispatch()
}

// dispatch hands the free slots to the longest waiting tests.
func (s *slots) dispatch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Now().Before(s.opens) {
		return
	}
	for s.free > 0 && len(s.waiting) > 0 {
		w := s.waiting[0]
		s.waiting = s.waiting[1:]
		s.free--
		if n := len(s.freedBy); n > 0 {
			w.from, s.freedBy = s.freedBy[n-1], s.freedBy[:n-1]
		}
		close(w.ready)
	}
}

// scheduled reports whether the test named name, or one of its ancestors,
// holds a slot.
func (s *slots) scheduled(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.holders[name] {
			return true
		}
		i := strings.LastIndex(name, "/")
		if i < 0 {
			return false
		}
		name = name[:i]
	}
}
