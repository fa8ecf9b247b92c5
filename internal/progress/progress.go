// Package progress reports long work (fetching, staging, writing a disk) as
// bytes done of a total. Packages that do the work take a Reporter; the CLI
// picks a terminal bar or plain log lines.
package progress

import (
	"io"
	"sync"
)

// Reporter starts tasks. Implementations must be safe for concurrent use.
type Reporter interface {
	// Task starts a unit of work named name of total bytes (0 if unknown).
	Task(name string, total int64) Task
}

// Task is one unit of work. Write counts bytes done (the bytes themselves
// are ignored, so a Task can sit in an io.TeeReader or io.MultiWriter); Done
// ends the task, err is nil on success.
//
// It is an alias of an unnamed interface so that lower packages (partitions)
// can declare the same Reporter interface without importing this one: the
// method sets are then identical and a Reporter satisfies both.
type Task = interface {
	io.Writer
	Done(err error)
}

// Discard is a Reporter that reports nothing.
func Discard() Reporter { return discard{} }

type discard struct{}

func (discard) Task(string, int64) Task { return discardTask{} }

type discardTask struct{}

func (discardTask) Write(p []byte) (int, error) { return len(p), nil }
func (discardTask) Done(error)                  {}

// Count reports n bytes done to w (a Task, which counts the bytes it is
// written and ignores them) without n bytes in hand: a step that skips
// holes or learns a size from a stat still moves its task.
func Count(w io.Writer, n int64) {
	for n > 0 {
		c := min(n, int64(len(zeros)))
		w.Write(zeros[:c])
		n -= c
	}
}

var zeros [64 << 10]byte

// Shared lets several goroutines count bytes on one task (a Task's Write
// need not be safe for concurrent use).
func Shared(w io.Writer) io.Writer { return &sharedWriter{w: w} }

type sharedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *sharedWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// Rename reports r's tasks under the names rename gives them: a step that
// works on a temporary file is named by what the user knows it as.
func Rename(r Reporter, rename func(string) string) Reporter {
	return renamed{r, rename}
}

type renamed struct {
	Reporter
	rename func(string) string
}

func (r renamed) Task(name string, total int64) Task { return r.Reporter.Task(r.rename(name), total) }
