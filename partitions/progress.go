package partitions

import "io"

// Reporter receives the progress of long steps (copying the base, writing
// the image filesystem) as bytes done of a total. internal/progress.Reporter
// satisfies it: both spell Task as the same unnamed interface, so this
// package needs nothing from the builder above it.
type Reporter interface {
	Task(name string, total int64) Task
}

// Task is one step; Write counts bytes done, Done ends it.
type Task = interface {
	io.Writer
	Done(err error)
}

type discard struct{}

func (discard) Task(string, int64) Task { return discardTask{} }

type discardTask struct{}

func (discardTask) Write(p []byte) (int, error) { return len(p), nil }
func (discardTask) Done(error)                  {}
