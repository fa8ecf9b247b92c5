package bundleimport

import (
	"fmt"
	"io"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// progress counts bytes written to it and prints a console line (done of
// total, rate) at most every few seconds, and at the end.
type progress struct {
	w            io.Writer
	verb         string
	total, n     int64
	start, shown time.Time
	now          func() time.Time
}

const progressEvery = 2 * time.Second

func (i *importer) progress(verb string, total int64) *progress {
	t := i.now()
	return &progress{w: i.log, verb: verb, total: total, start: t, shown: t, now: i.now}
}

func (p *progress) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if t := p.now(); t.Sub(p.shown) >= progressEvery {
		p.shown = t
		p.line()
	}
	return len(b), nil
}

func (p *progress) line() {
	secs := p.now().Sub(p.start).Seconds()
	rate := ""
	if secs > 0 {
		rate = fmt.Sprintf(", %s/s", contract.Bytes(int64(float64(p.n)/secs)))
	}
	pct := 100.0
	if p.total > 0 {
		pct = 100 * float64(p.n) / float64(p.total)
	}
	fmt.Fprintf(p.w, "  %s %s of %s (%.0f%%%s)\n", p.verb, contract.Bytes(p.n), contract.Bytes(p.total), pct, rate)
}

func (p *progress) done() { p.line() }
