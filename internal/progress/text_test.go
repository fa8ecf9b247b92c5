package progress

import (
	"strings"
	"testing"
	"time"
)

func TestLogLines(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	clock := time.Unix(0, 0)
	r := New(&b, false).(*text)
	r.now = func() time.Time { return clock }
	task := r.Task("fetch quay.io/acme/app:1.2", 2<<20)
	task.Write(make([]byte, 2<<20))
	clock = clock.Add(2 * time.Second)
	task.Done(nil)
	want := "fetch quay.io/acme/app:1.2: started (2.0 MiB)\nfetch quay.io/acme/app:1.2: done, 2.0 MiB in 2s (1.0 MiB/s)\n"
	if b.String() != want {
		t.Fatalf("got\n%q\nwant\n%q", b.String(), want)
	}
}

func TestTerminalRedrawsInPlace(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	clock := time.Unix(0, 0)
	r := New(&b, true).(*text)
	r.now = func() time.Time { return clock }
	task := r.Task("stage", 100)
	clock = clock.Add(time.Second)
	task.Write(make([]byte, 50))
	if !strings.Contains(b.String(), "stage: 50 B / 100 B   50%") {
		t.Fatalf("no status line: %q", b.String())
	}
	task.Done(nil)
	if !strings.Contains(b.String(), "\r") || !strings.HasSuffix(b.String(), "stage: done, 50 B in 1s (50 B/s)\n") {
		t.Fatalf("line not cleared before the done line: %q", b.String())
	}
}

func TestEveryLogsProgressLines(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	clock := time.Unix(0, 0)
	r := New(&b, false, Every(2*time.Second)).(*text)
	r.now = func() time.Time { return clock }
	task := r.Task("copy 3 blob(s)", 4<<20)
	clock = clock.Add(time.Second)
	task.Write(make([]byte, 1<<20)) // too soon for a line
	clock = clock.Add(time.Second)
	task.Write(make([]byte, 1<<20))
	clock = clock.Add(time.Second)
	task.Write(make([]byte, 2<<20)) // too soon after the last line
	task.Done(nil)
	want := "copy 3 blob(s): started (4.0 MiB)\n" +
		"copy 3 blob(s): 2.0 MiB of 4.0 MiB (50%), 1.0 MiB/s\n" +
		"copy 3 blob(s): done, 4.0 MiB in 3s (1.3 MiB/s)\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
