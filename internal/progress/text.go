package progress

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/kiln-appliance/kiln/internal/human"
)

// New returns a Reporter writing to w: a live status line redrawn in place
// when w is a terminal, plain log lines (one when a task starts, one when it
// ends, with bytes and rate) otherwise, so CI logs stay readable.
func New(w io.Writer, terminal bool, opts ...Option) Reporter {
	r := &text{w: w, terminal: terminal, now: time.Now}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Option configures New.
type Option func(*text)

// Every adds, to the log lines, one per running task at most every d with
// the bytes done and the rate: for a console that must show long work is
// moving (the node's import) but cannot redraw a line.
func Every(d time.Duration) Option { return func(r *text) { r.every = d } }

type text struct {
	w        io.Writer
	terminal bool
	every    time.Duration
	now      func() time.Time

	mu         sync.Mutex
	active     map[*task]struct{}
	lastDraw   time.Time
	lineLength int
}

type task struct {
	r     *text
	name  string
	total int64
	done  int64
	start time.Time
	shown time.Time // the last progress line (Every)
}

func (r *text) Task(name string, total int64) Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &task{r: r, name: name, total: total, start: r.now()}
	t.shown = t.start
	if r.active == nil {
		r.active = map[*task]struct{}{}
	}
	r.active[t] = struct{}{}
	if !r.terminal {
		if total > 0 {
			fmt.Fprintf(r.w, "%s: started (%s)\n", name, human.Bytes(total))
		} else {
			fmt.Fprintf(r.w, "%s: started\n", name)
		}
	}
	return t
}

func (t *task) Write(p []byte) (int, error) {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	t.done += int64(len(p))
	switch now := r.now(); {
	case r.terminal && now.Sub(r.lastDraw) > 100*time.Millisecond:
		r.draw()
	case !r.terminal && r.every > 0 && now.Sub(t.shown) >= r.every:
		t.shown = now
		line := fmt.Sprintf("%s: %s", t.name, human.Bytes(t.done))
		if t.total > 0 {
			line += fmt.Sprintf(" of %s (%d%%)", human.Bytes(t.total), t.done*100/t.total)
		}
		fmt.Fprintf(r.w, "%s, %s/s\n", line, human.Bytes(rate(t.done, now.Sub(t.start))))
	}
	return len(p), nil
}

func (t *task) Done(err error) {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.active[t]; !ok {
		return // Done twice
	}
	delete(r.active, t)
	r.clear()
	elapsed := r.now().Sub(t.start)
	switch {
	case err != nil:
		fmt.Fprintf(r.w, "%s: failed after %s: %v\n", t.name, elapsed.Round(time.Millisecond), err)
	case t.done > 0:
		fmt.Fprintf(r.w, "%s: done, %s in %s (%s/s)\n", t.name, human.Bytes(t.done), elapsed.Round(time.Millisecond), human.Bytes(rate(t.done, elapsed)))
	default:
		fmt.Fprintf(r.w, "%s: done in %s\n", t.name, elapsed.Round(time.Millisecond))
	}
	if r.terminal {
		r.draw()
	}
}

// draw redraws the status line: the active tasks' bytes done of their total.
func (r *text) draw() {
	r.lastDraw = r.now()
	if len(r.active) == 0 {
		return
	}
	var done, total int64
	var name string
	var start time.Time
	for t := range r.active {
		done += t.done
		total += t.total
		if name == "" || t.start.Before(start) {
			name, start = t.name, t.start
		}
	}
	if len(r.active) > 1 {
		name = fmt.Sprintf("%s (+%d more)", name, len(r.active)-1)
	}
	line := fmt.Sprintf("%s: %s", name, human.Bytes(done))
	if total > 0 {
		line += fmt.Sprintf(" / %s  %3d%%", human.Bytes(total), done*100/max(total, 1))
	}
	line += fmt.Sprintf("  %s/s", human.Bytes(rate(done, r.now().Sub(start))))
	r.clear()
	fmt.Fprint(r.w, line)
	r.lineLength = len(line)
}

func (r *text) clear() {
	if r.terminal && r.lineLength > 0 {
		fmt.Fprintf(r.w, "\r%*s\r", r.lineLength, "")
		r.lineLength = 0
	}
}

func rate(n int64, d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(float64(n) / d.Seconds())
}
