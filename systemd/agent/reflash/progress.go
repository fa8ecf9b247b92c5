package reflash

import (
	"fmt"
	"io"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// progressEvery spaces the console's progress lines.
const progressEvery = 5 * time.Second

// task prints "NAME: X of Y (P%, R/s)" at most every progressEvery, and a
// last line when Done.
type task struct {
	out          io.Writer
	name         string
	total, n     int64
	start, shown time.Time
	now          func() time.Time
}

func (r *reflasher) task(name string, total int64) *task {
	t := r.now()
	fmt.Fprintf(r.out, "%s: started (%s)\n", name, contract.Bytes(total))
	return &task{out: r.out, name: name, total: total, start: t, shown: t, now: r.now}
}

func (t *task) Write(p []byte) (int, error) {
	t.n += int64(len(p))
	if now := t.now(); now.Sub(t.shown) >= progressEvery {
		t.shown = now
		fmt.Fprintf(t.out, "%s: %s of %s (%.0f%%, %s)\n", t.name, contract.Bytes(t.n), contract.Bytes(t.total),
			100*float64(t.n)/float64(max(t.total, 1)), t.rate(now))
	}
	return len(p), nil
}

func (t *task) Done(err error) {
	now := t.now()
	if err != nil {
		fmt.Fprintf(t.out, "%s: FAILED after %s\n", t.name, contract.Bytes(t.n))
		return
	}
	fmt.Fprintf(t.out, "%s: done, %s in %s (%s)\n", t.name, contract.Bytes(t.n), now.Sub(t.start).Round(time.Millisecond), t.rate(now))
}

func (t *task) rate(now time.Time) string {
	secs := now.Sub(t.start).Seconds()
	if secs <= 0 {
		return "-"
	}
	return contract.Bytes(int64(float64(t.n)/secs)) + "/s"
}
