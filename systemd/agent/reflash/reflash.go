// Package reflash is `kiln agent reflash`, run on a recovery stick's boot:
// it picks the replacement disk, shows it, asks once (unless unattended),
// writes the stick's copy of the appliance disk, each 4 MiB checked against
// its record first (skipping zeros the target already holds), flushes each
// 64 MiB written and reads it back from the disk, compared with the stick's
// checked bytes, while the next is written, and powers off.
package reflash

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/blockdev"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

// Option configures a reflash.
type Option func(*reflasher)

// WithConsole sets where the question is read and everything is said
// (default stdin, stdout: the unit puts them on the console).
func WithConsole(in io.Reader, out io.Writer) Option {
	return func(r *reflasher) { r.in, r.out = in, out }
}

// WithUnattended writes without asking, whatever the record says.
func WithUnattended() Option { return func(r *reflasher) { r.unattended = true } }

// WithTarget replaces the record's target rule.
func WithTarget(t recovery.Target) Option { return func(r *reflasher) { r.rule = &t } }

// WithCandidates limits the disks considered to these paths (tests: loop
// devices are otherwise skipped as virtual).
func WithCandidates(paths ...string) Option {
	return func(r *reflasher) { r.candidates = append([]string{}, paths...) }
}

// WithPowerOff sets what runs after success (default systemctl poweroff;
// nil: nothing).
func WithPowerOff(f func() error) Option { return func(r *reflasher) { r.powerOff = f } }

type reflasher struct {
	payload    string
	in         io.Reader
	out        io.Writer
	unattended bool
	rule       *recovery.Target
	candidates []string
	bootMounts []string
	powerOff   func() error
	progress   progress.Reporter
	// region is regionChunks but in tests; beforeReadBack, when set, runs
	// after chunks [from, to) are flushed and before they are read back.
	region         int
	beforeReadBack func(from, to int)
}

// sysfs is where the kernel describes the disks.
const sysfs = "/sys"

// progressEvery spaces the console's progress lines.
const progressEvery = 5 * time.Second

// Run reflashes from the mounted payload directory. Every refusal comes
// before the first byte is written and says so; a failed write or
// read-back says what to do next.
func Run(ctx context.Context, payload string, opts ...Option) error {
	r := &reflasher{
		payload: payload, in: os.Stdin, out: os.Stdout,
		bootMounts: []string{"/", "/boot", "/sysroot", "/usr"},
		powerOff:   func() error { return exec.Command("systemctl", "poweroff").Run() },
		region:     regionChunks,
	}
	for _, o := range opts {
		o(r)
	}
	r.progress = progress.New(r.out, false, progress.Every(progressEvery))
	rec, err := recovery.Read(payload)
	if err != nil {
		return fmt.Errorf("%w; use another stick", err)
	}
	image := filepath.Join(payload, recovery.DiskFile)
	if fi, err := os.Stat(image); err != nil {
		return fmt.Errorf("the stick's disk image: %w; use another stick", err)
	} else if fi.Size() != rec.Size {
		return fmt.Errorf("the stick's disk image %s holds %d bytes, its record says %d: the stick is damaged; use another stick; nothing was written",
			image, fi.Size(), rec.Size)
	}
	fmt.Fprintf(r.out, "kiln reflash: this stick carries the appliance disk %s (%s, %s)\n", rec.DiskGUID, human.Bytes(rec.Size), rec.SHA256)

	rule := rec.Target
	if r.rule != nil {
		rule = *r.rule
	}
	target, err := r.pick(rule, rec.Size)
	if err != nil {
		return err
	}
	if target.Size < rec.Size {
		return fmt.Errorf("%s is too small: it holds %s (%d bytes), the appliance disk needs at least %s (%d bytes); "+
			"use a disk of at least that size; nothing was written", target, human.Bytes(target.Size), target.Size, human.Bytes(rec.Size), rec.Size)
	}
	if target.ReadOnly {
		return fmt.Errorf("%s is read-only: nothing was written", target)
	}
	fmt.Fprintf(r.out, "kiln reflash: will overwrite %s%s: everything on it is lost\n", target, r.holds(target))
	if err := r.confirm(rec, target); err != nil {
		return err
	}

	skipped, err := r.write(ctx, rec, image, target)
	var werr targetError
	var rerr readBackError
	switch {
	case errors.As(err, &rerr):
		return fmt.Errorf("read back %s: %w: the disk did not keep what was written%s; run the reflash again, or use another disk", target.Path, rerr.error, rerr.headNote())
	case errors.Is(err, recovery.ErrDamaged):
		return fmt.Errorf("the stick is damaged: its disk image, %w; %s was left without a partition table, so it does not boot half-written; use another stick", err, target.Path)
	case errors.As(err, &werr):
		return fmt.Errorf("write %s: %w: the disk is incomplete and will not boot; run the reflash again, or use another disk", target.Path, werr.error)
	case err != nil:
		return fmt.Errorf("%w; %s was left without a partition table, so it does not boot half-written; run the reflash again, or use another stick", err, target.Path)
	}
	if skipped > 0 {
		fmt.Fprintf(r.out, "kiln reflash: %s of zeros not written: %s already read zero there\n", human.Bytes(skipped), target.Path)
	}
	fmt.Fprintf(r.out, "kiln reflash: %s holds the appliance disk %s, read back and identical\n", target.Path, rec.SHA256)
	fmt.Fprintln(r.out, "done — remove the stick and power on")
	if r.powerOff != nil {
		if err := r.powerOff(); err != nil {
			return fmt.Errorf("power off: %w (the disk is written: remove the stick and power off by hand)", err)
		}
	}
	return nil
}

// holds says what the target holds now, from its partitions in sysfs.
func (r *reflasher) holds(d *blockdev.Device) string {
	parts, _ := filepath.Glob(filepath.Join(sysfs, "block", d.Name, d.Name+"*", "partition"))
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf(", which holds %d partition(s)", len(parts))
}

// confirm asks once on the console: "yes" or the disk's serial.
func (r *reflasher) confirm(rec *recovery.Record, d *blockdev.Device) error {
	if r.unattended || rec.Unattended {
		fmt.Fprintln(r.out, "kiln reflash: unattended stick: not asking")
		return nil
	}
	q := `type "yes"`
	if d.Serial != "" {
		q += fmt.Sprintf(" or the disk's serial (%s)", d.Serial)
	}
	fmt.Fprintf(r.out, "kiln reflash: %s and press Enter to overwrite %s, anything else to stop: ", q, d.Path)
	line, err := bufio.NewReader(r.in).ReadString('\n')
	answer := strings.TrimSpace(line)
	if answer == "yes" || (d.Serial != "" && answer == d.Serial) {
		return nil
	}
	if err != nil && answer == "" {
		return fmt.Errorf("no answer on the console (%v): nothing was written", err)
	}
	return fmt.Errorf("not confirmed (%q): nothing was written; power off and remove the stick to keep the disk as it is", answer)
}

// targetError is a failure of the target disk, not of the stick.
type targetError struct{ error }

func (e targetError) Unwrap() error { return e.error }

// readBackError is a read-back that failed or did not match: the target did
// not keep what was written. headZero says its first chunk reads zero.
type readBackError struct {
	error
	headZero bool
}

func (e readBackError) Unwrap() error { return e.error }

func (e readBackError) headNote() string {
	if e.headZero {
		return "; it was left without a partition table, so it does not boot"
	}
	return ""
}

// regionChunks is how many chunks are written before they are flushed and
// read back, while the next ones are written: the read-back overlaps the
// write, and what is left after the last write is one region's read-back.
// Each region costs a flush of the disk's cache, and the writer holds the
// data chunks of at most two regions (128 MiB) for the read-back to compare
// with.
const regionChunks = 16 // 64 MiB
// write copies the image onto the target and reads it back, each chunk of
// the stick checked against the record just before it is written: the
// stick is read once, as dd reads it. Every regionChunks chunks written are
// flushed to the device (fdatasync: written out and the device's cache
// flushed) and read back from it (O_DIRECT) while the next ones are
// written, each chunk compared with the stick's bytes written there, which
// were checked against the record (so the read-back is checked against the
// record without hashing everything a second time). The target's first
// chunk (where a partition table lives) is zeroed before anything else, and
// the image's first chunk is written, flushed and read back last, only once
// every other chunk read back right: a stick found damaged half-way, a
// write that fails or a read-back that differs leaves a disk with no
// partition table, never one that looks bootable and is not
// (coreos-installer does the same). An all-zero chunk is written only where
// the target does not already read zero. It returns the bytes skipped.
func (r *reflasher) write(ctx context.Context, rec *recovery.Record, image string, d *blockdev.Device) (int64, error) {
	in, err := os.Open(image)
	if err != nil {
		return 0, fmt.Errorf("the stick's disk image: %w", err)
	}
	defer in.Close()
	// O_EXCL on a block device: the kernel refuses it while mounted or held.
	out, err := os.OpenFile(d.Path, os.O_RDWR|unix.O_EXCL, 0)
	if err != nil {
		return 0, targetError{fmt.Errorf("open: %w (is it mounted or in use?)", err)}
	}
	defer out.Close()
	// Every read of the target, the zero checks too, comes from the disk.
	back, err := blockdev.OpenDirect(d.Path)
	if err != nil {
		return 0, targetError{err}
	}
	defer back.Close()
	old := make([]byte, recovery.ChunkSize)
	head := min(recovery.ChunkSize, rec.Size)
	if _, err := back.ReadAt(old[:head], 0); err != nil {
		return 0, targetError{err}
	}
	if !zero(old[:head]) {
		if _, err := out.WriteAt(zeros()[:head], 0); err != nil {
			return 0, targetError{err}
		}
		if err := blockdev.Sync(out); err != nil {
			return 0, targetError{err}
		}
	}

	wt := r.progress.Task("write "+d.Path, rec.Size)
	rt := r.progress.Task("read back "+d.Path, rec.Size)
	skipped, first, err := r.writeAndReadBack(ctx, copying{rec: rec, in: in, out: out, back: back, wt: wt, rt: rt})
	if err == nil {
		// Last: the partition table, once every other byte read back right.
		if _, err = out.WriteAt(first, 0); err != nil {
			err = targetError{err}
		} else if err = blockdev.Sync(out); err != nil {
			err = targetError{err}
		}
		if err == nil {
			wt.Done(nil)
			wt = nil
			if r.beforeReadBack != nil {
				r.beforeReadBack(0, 1)
			}
			err = rec.VerifyWith(ctx, back, 0, 1, sameAs(rec, [][]byte{first}, 0), counted(rt))
			if err != nil {
				// Best effort: a disk whose partition table did not stick must not look bootable.
				_, zerr := out.WriteAt(zeros()[:head], 0)
				if zerr == nil {
					zerr = blockdev.Sync(out)
				}
				err = readBackError{err, zerr == nil}
			}
		}
	}
	if wt != nil {
		wt.Done(err)
	}
	rt.Done(err)
	return skipped, err
}

// region is chunks [from, to) written, with the stick's bytes of each data
// chunk (nil: a zero chunk) for the read-back to compare with.
type region struct {
	from, to int
	data     [][]byte
}

// copying is what write hands writeAndReadBack: the stick's image and its
// record, the target opened for writing and for reading back from the disk,
// and the two tasks.
type copying struct {
	rec    *recovery.Record
	in     io.ReaderAt // the stick's disk image
	out    *os.File    // the target
	back   io.ReaderAt // the target read with O_DIRECT
	wt, rt io.Writer   // the write's and the read-back's progress
}

// writeAndReadBack writes every chunk but the first (which it returns) and
// reads each region back once it is written, as write says.
func (r *reflasher) writeAndReadBack(ctx context.Context, c copying) (skipped int64, first []byte, err error) {
	rec, in, out, back, wt, rt := c.rec, c.in, c.out, c.back, c.wt, c.rt
	n := len(rec.Chunks)
	written := make(chan region, n/r.region+2) // never blocks the writer
	held := make(chan []byte, 2*r.region)      // the writer's copies: two regions at most
	for range cap(held) {
		held <- nil // allocated on first use: a mostly-zero disk needs few
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		for reg := range written {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := blockdev.Sync(out); err != nil {
				return targetError{err}
			}
			if r.beforeReadBack != nil {
				r.beforeReadBack(reg.from, reg.to)
			}
			err := rec.VerifyWith(ctx, back, reg.from, reg.to, sameAs(rec, reg.data, reg.from), counted(rt))
			if err != nil && ctx.Err() == nil {
				return readBackError{err, true} // the head is still zero
			}
			if err != nil {
				return err
			}
			for _, b := range reg.data {
				if b != nil {
					held <- b
				}
			}
		}
		return nil
	})
	g.Go(func() error {
		defer close(written)
		old := make([]byte, recovery.ChunkSize)
		reg := region{from: 1, to: 1}
		// put writes chunk i (b, checked against the record) unless it is
		// zero and the target reads zero there, and keeps a copy of a data
		// chunk for the read-back.
		put := func(i int, b []byte) error {
			off := int64(i) * recovery.ChunkSize
			if zero(b) {
				reg.data = append(reg.data, nil)
				if _, rerr := back.ReadAt(old[:len(b)], off); rerr == nil && zero(old[:len(b)]) {
					skipped += int64(len(b))
					return nil
				}
			} else {
				var c []byte
				select {
				case c = <-held:
				case <-ctx.Done():
					return ctx.Err()
				}
				if c == nil {
					c = make([]byte, recovery.ChunkSize)
				}
				c = c[:copy(c[:cap(c)], b)]
				reg.data = append(reg.data, c)
			}
			if _, err := out.WriteAt(b, off); err != nil {
				return targetError{err}
			}
			return nil
		}
		err := rec.Verify(ctx, in, 0, n, func(i int, b []byte) error {
			if i == 0 {
				first = append([]byte(nil), b...) // last
			} else if err := put(i, b); err != nil {
				return err
			}
			wt.Write(b)
			if reg.to = i + 1; reg.to == n || reg.to%r.region == 0 {
				if reg.to > reg.from {
					written <- reg
				}
				reg = region{from: reg.to, to: reg.to}
			}
			return nil
		})
		var terr targetError
		if err != nil && !errors.As(err, &terr) && !errors.Is(err, recovery.ErrDamaged) && !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("read the stick's disk image: %w", err)
		}
		return err
	})
	err = g.Wait()
	return skipped, first, err
}

// sameAs checks a chunk read back against data, the stick's bytes of the
// chunks from on, already checked against the record (nil: zeros).
func sameAs(rec *recovery.Record, data [][]byte, from int) func(i int, b []byte) error {
	return func(i int, b []byte) error {
		want := data[i-from]
		if want == nil {
			want = zeros()[:len(b)]
		}
		if !bytes.Equal(b, want) {
			return rec.Damaged(i)
		}
		return nil
	}
}

// counted hands each chunk's bytes to a progress task.
func counted(t io.Writer) func(int, []byte) error {
	return func(_ int, b []byte) error { t.Write(b); return nil }
}

// zeros is made on first use, not at init: kiln serve links this package.
var zeros = sync.OnceValue(func() []byte { return make([]byte, blockdev.Chunk) })

func zero(b []byte) bool { return bytes.Equal(b, zeros()[:len(b)]) }
