package progress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
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

// Every adds, to the log lines, one per running task every d with the bytes
// done, the rate and the time left: a log or a console that cannot redraw a
// line still shows that long work is moving, or that it stalled (the lines
// come from a clock, not only from the work's writes).
func Every(d time.Duration) Option { return func(r *text) { r.every = d } }

// redrawEvery refreshes a terminal's status line when no bytes move, so its
// rate and time left do not freeze on a stall.
const redrawEvery = time.Second

type text struct {
	w        io.Writer
	terminal bool
	every    time.Duration
	now      func() time.Time

	mu         sync.Mutex
	active     map[*task]struct{}
	lastDraw   time.Time
	lineLength int
	stopTicker chan struct{} // non-nil while the ticker runs
	noTicker   bool          // tests drive tick with their own clock
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
	r.startTicker()
	return t
}

func (t *task) Write(p []byte) (int, error) {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	t.done += int64(len(p))
	r.tick(r.now())
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
	if len(r.active) == 0 && r.stopTicker != nil {
		close(r.stopTicker)
		r.stopTicker = nil
	}
	r.clear()
	fmt.Fprintln(r.w, doneLine(t.name, t.done, t.total, r.now().Sub(t.start), err))
	if r.terminal {
		r.draw()
	}
}

// startTicker makes tick run on a clock while tasks are active (Done
// stops it with the last one).
func (r *text) startTicker() {
	d := r.every
	if r.terminal {
		d = redrawEvery
	}
	if d <= 0 || r.noTicker || r.stopTicker != nil {
		return
	}
	stop := make(chan struct{})
	r.stopTicker = stop
	go func() {
		ticker := time.NewTicker(d)
		defer ticker.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ticker.C:
				r.mu.Lock()
				r.tick(r.now())
				r.mu.Unlock()
			}
		}
	}()
}

// tick shows what is due at now: the terminal's status line, redrawn at
// most every 100 ms, or a log line for each task not shown for r.every.
func (r *text) tick(now time.Time) {
	if r.terminal {
		if now.Sub(r.lastDraw) >= 100*time.Millisecond {
			r.draw()
		}
		return
	}
	if r.every <= 0 {
		return
	}
	tasks := make([]*task, 0, len(r.active))
	for t := range r.active {
		if now.Sub(t.shown) >= r.every {
			tasks = append(tasks, t)
		}
	}
	// The oldest task first, as they started.
	slices.SortFunc(tasks, func(a, b *task) int { return a.start.Compare(b.start) })
	for _, t := range tasks {
		t.shown = now
		fmt.Fprintln(r.w, statusLine(t.name, t.done, t.total, now.Sub(t.start)))
	}
}

// draw redraws the status line: the active tasks' bytes done of their total.
func (r *text) draw() {
	now := r.now()
	r.lastDraw = now
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
	line := statusLine(name, done, total, now.Sub(start))
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

// statusLine is a running task's progress after elapsed: bytes done of the
// total, the rate and the time left (while both are known), or only how
// long it has run when it counts no bytes.
func statusLine(name string, done, total int64, elapsed time.Duration) string {
	if done == 0 && total == 0 {
		return fmt.Sprintf("%s: running for %s", name, clock(elapsed))
	}
	line := fmt.Sprintf("%s: %s", name, human.Bytes(done))
	if total > 0 {
		line += fmt.Sprintf(" of %s (%d%%)", human.Bytes(total), done*100/total)
	}
	perSecond := rate(done, elapsed)
	line += fmt.Sprintf(", %s/s", human.Bytes(perSecond))
	if total > done && perSecond > 0 {
		left := time.Duration(float64(total-done) / float64(perSecond) * float64(time.Second))
		line += fmt.Sprintf(", about %s left", clock(left))
	}
	return line
}

// doneLine ends a task. Its bytes are the same quantity as the started
// line's total: a task that ends visibly short of (or past) its total says
// both.
func doneLine(name string, done, total int64, elapsed time.Duration, err error) string {
	took := elapsed.Round(time.Millisecond)
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Sprintf("%s: interrupted after %s", name, took)
	case err != nil:
		return fmt.Sprintf("%s: failed after %s: %v", name, took, err)
	case done == 0:
		return fmt.Sprintf("%s: done in %s", name, took)
	}
	bytes := human.Bytes(done)
	if of := human.Bytes(total); total > 0 && of != bytes { // as printed: 26.0 MiB of 26.0 MiB says nothing
		bytes += " of " + of
	}
	return fmt.Sprintf("%s: done, %s in %s (%s/s)", name, bytes, took, human.Bytes(rate(done, elapsed)))
}

// clock prints a duration to the second, for a person watching: 45s,
// 2m05s, 1h20m (to the minute from an hour on).
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

func rate(n int64, d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(float64(n) / d.Seconds())
}
