package vm

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// The slots go to the longest waiting tests first, never more at once than
// there are slots, and a subtest runs in its ancestor's slot.
func TestSlotsLongestFirst(t *testing.T) {
	s := &slots{free: 2, holders: map[string]bool{}}
	var mu sync.Mutex
	var order []string
	running, most := 0, 0
	var wg sync.WaitGroup
	for _, w := range []struct {
		name     string
		expected time.Duration
	}{{"short", time.Minute}, {"longest", 17 * time.Minute}, {"mid", 7 * time.Minute}, {"long", 12 * time.Minute}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.acquire(w.name, w.expected)
			mu.Lock()
			order = append(order, w.name)
			running++
			most = max(most, running)
			mu.Unlock()
			// longest gives its slot back first: mid gets it, short
			// waits for the next one.
			hold := 300 * time.Millisecond
			if w.name == "longest" {
				hold = 30 * time.Millisecond
			}
			time.Sleep(hold)
			mu.Lock()
			running--
			mu.Unlock()
			s.release(w.name)
		}()
	}
	wg.Wait()
	// The first two slots are handed out together: either may start first.
	first := slices.Sorted(slices.Values(order[:2]))
	if !slices.Equal(first, []string{"long", "longest"}) || !slices.Equal(order[2:], []string{"mid", "short"}) {
		t.Errorf("slots went to %v, want long and longest, then mid, then short", order)
	}
	if most != 2 {
		t.Errorf("%d ran at once, want 2", most)
	}

	s.acquire("TestReflash/attended", time.Minute)
	if !s.scheduled("TestReflash/attended") || !s.scheduled("TestReflash/attended/sub") || s.scheduled("TestReflash") {
		t.Error("a slot covers its test and its subtests, not its parent")
	}
	s.release("TestReflash/attended")
	if s.scheduled("TestReflash/attended") {
		t.Error("a released slot still covers its test")
	}
}
