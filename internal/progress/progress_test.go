package progress

import (
	"strings"
	"testing"
)

type writes struct {
	n, total, largest int
}

func (w *writes) Write(p []byte) (int, error) {
	w.n++
	w.total += len(p)
	w.largest = max(w.largest, len(p))
	return len(p), nil
}

// Count moves a task by exactly n bytes, in writes of a bounded buffer.
func TestCount(t *testing.T) {
	for _, tc := range []struct {
		n          int64
		wantWrites int
	}{
		{0, 0}, {1, 1}, {64 << 10, 1}, {64<<10 + 1, 2}, {5<<20 + 3, 81},
	} {
		var w writes
		Count(&w, tc.n)
		if int64(w.total) != tc.n || w.n != tc.wantWrites || w.largest > 64<<10 {
			t.Errorf("Count(%d): %d bytes in %d writes (largest %d), want %d bytes in %d writes of at most 64 KiB",
				tc.n, w.total, w.n, w.largest, tc.n, tc.wantWrites)
		}
	}
}

// Rename passes the new name and the total on, and the task's bytes.
func TestRename(t *testing.T) {
	var b strings.Builder
	r, _ := newFake(&b, false)
	task := Rename(r, func(n string) string { return strings.ReplaceAll(n, "/tmp/.work-1/disk.raw", "the appliance disk") }).
		Task("verify /tmp/.work-1/disk.raw", 100)
	task.Write(make([]byte, 100))
	task.Done(nil)
	if want := "verify the appliance disk: started (100 B)\nverify the appliance disk: done, 100 B in 0s (0 B/s)\n"; b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
