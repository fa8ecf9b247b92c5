// Package reflash is `kiln agent reflash`, run on a recovery stick's boot:
// it picks the replacement disk, shows it, asks once (unless unattended),
// checks the stick's copy of the appliance disk against its record, writes
// it (skipping zeros the target already holds), flushes, reads every byte
// back against the record, and powers off.
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
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/blockdev"
	"github.com/kiln-appliance/kiln/systemd/contract"
	format "github.com/kiln-appliance/kiln/systemd/contract/reflash"
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
func WithTarget(t format.Target) Option { return func(r *reflasher) { r.rule = &t } }

// WithCandidates limits the disks considered to these paths (tests: loop
// devices are otherwise skipped as virtual).
func WithCandidates(paths ...string) Option {
	return func(r *reflasher) { r.candidates = append([]string{}, paths...) }
}

// WithSysfs sets the sysfs root (default /sys).
func WithSysfs(root string) Option { return func(r *reflasher) { r.sysfs = root } }

// WithBootMounts sets the mount points whose disks are the running
// system's (default /, /boot, /sysroot, /usr).
func WithBootMounts(points ...string) Option { return func(r *reflasher) { r.bootMounts = points } }

// WithPowerOff sets what runs after success (default systemctl poweroff;
// nil: nothing).
func WithPowerOff(f func() error) Option { return func(r *reflasher) { r.powerOff = f } }

type reflasher struct {
	payload    string
	in         io.Reader
	out        io.Writer
	unattended bool
	rule       *format.Target
	candidates []string
	sysfs      string
	bootMounts []string
	powerOff   func() error
	now        func() time.Time
}

// Run reflashes from the mounted payload directory. Every refusal comes
// before the first byte is written and says so; a failed write or
// read-back says what to do next.
func Run(ctx context.Context, payload string, opts ...Option) error {
	r := &reflasher{
		payload: payload, in: os.Stdin, out: os.Stdout, sysfs: "/sys",
		bootMounts: []string{"/", "/boot", "/sysroot", "/usr"},
		powerOff:   func() error { return exec.Command("systemctl", "poweroff").Run() },
		now:        time.Now,
	}
	for _, o := range opts {
		o(r)
	}
	rec, err := format.Read(payload)
	if err != nil {
		return fmt.Errorf("%w; use another stick", err)
	}
	image := filepath.Join(payload, format.DiskFile)
	if fi, err := os.Stat(image); err != nil {
		return fmt.Errorf("the stick's disk image: %w; use another stick", err)
	} else if fi.Size() != rec.Size {
		return fmt.Errorf("the stick's disk image %s holds %d bytes, its record says %d: the stick is damaged; use another stick; nothing was written",
			image, fi.Size(), rec.Size)
	}
	fmt.Fprintf(r.out, "kiln reflash: this stick carries the appliance disk %s (%s, %s)\n", rec.DiskGUID, contract.Bytes(rec.Size), rec.SHA256)

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
			"use a disk of at least that size; nothing was written", target, contract.Bytes(target.Size), target.Size, contract.Bytes(rec.Size), rec.Size)
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
	switch {
	case errors.Is(err, format.ErrDamaged):
		return fmt.Errorf("the stick is damaged: its disk image, %w; %s was left without a partition table, so it does not boot half-written; use another stick", err, target.Path)
	case errors.As(err, &werr):
		return fmt.Errorf("write %s: %w: the disk is incomplete and will not boot; run the reflash again, or use another disk", target.Path, werr.error)
	case err != nil:
		return fmt.Errorf("%w; %s was left without a partition table, so it does not boot half-written; run the reflash again, or use another stick", err, target.Path)
	}
	if skipped > 0 {
		fmt.Fprintf(r.out, "kiln reflash: %s of zeros not written: %s already read zero there\n", contract.Bytes(skipped), target.Path)
	}
	if err := r.readBack(ctx, rec, target); err != nil {
		return err
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
	parts, _ := filepath.Glob(filepath.Join(r.sysfs, "block", d.Name, d.Name+"*", "partition"))
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf(", which holds %d partition(s)", len(parts))
}

// confirm asks once on the console: "yes" or the disk's serial.
func (r *reflasher) confirm(rec *format.Record, d *blockdev.Device) error {
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

// write copies the image onto the target, each chunk checked against the
// record just before it is written: the stick is read once, as dd reads it.
// The target's first chunk (where a partition table lives) is zeroed before
// anything else and the image's first chunk is written last, so a stick
// found damaged half-way, or a write that fails, leaves a disk with no
// partition table, never one that looks bootable and is not (what
// coreos-installer does too). An all-zero chunk is written only where the
// target does not already read zero. It returns the bytes skipped.
func (r *reflasher) write(ctx context.Context, rec *format.Record, image string, d *blockdev.Device) (int64, error) {
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
	// What the target reads must come from the disk, not from the cache.
	if err := unix.IoctlSetInt(int(out.Fd()), unix.BLKFLSBUF, 0); err != nil {
		return 0, targetError{fmt.Errorf("drop the cache: %w", err)}
	}
	old := make([]byte, format.ChunkSize)
	head := min(format.ChunkSize, rec.Size)
	if _, err := out.ReadAt(old[:head], 0); err != nil {
		return 0, targetError{err}
	}
	if !zero(old[:head]) {
		if _, err := out.WriteAt(zeros()[:head], 0); err != nil {
			return 0, targetError{err}
		}
		if err := blockdev.Flush(out); err != nil {
			return 0, targetError{err}
		}
	}

	var skipped int64
	first := make([]byte, head)
	t := r.task("write "+d.Path, rec.Size)
	err = eachChunk(ctx, rec, in, func(i int, b []byte) error {
		defer t.Write(b)
		off := int64(i) * format.ChunkSize
		switch {
		case i == 0:
			copy(first, b) // last
			return nil
		case zero(b):
			if _, rerr := out.ReadAt(old[:len(b)], off); rerr == nil && zero(old[:len(b)]) {
				skipped += int64(len(b))
				return nil
			}
		}
		if _, err := out.WriteAt(b, off); err != nil {
			return targetError{err}
		}
		return nil
	})
	if err == nil {
		if _, err = out.WriteAt(first, 0); err != nil {
			err = targetError{err}
		}
	}
	if err == nil {
		if err = blockdev.Flush(out); err != nil {
			err = targetError{err}
		}
	}
	t.Done(err)
	return skipped, err
}

// eachChunk reads the image's chunks, each read and checked against the
// record on a core of its own while earlier ones are written, and calls
// write for each in order. A damaged chunk or a failed read stops it before
// write sees that chunk.
func eachChunk(ctx context.Context, rec *format.Record, in io.ReaderAt, write func(i int, b []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		b   []byte
		err error
	}
	workers := runtime.GOMAXPROCS(0)
	pool := make(chan []byte, workers+1) // bounds the chunks in memory
	for range cap(pool) {
		pool <- make([]byte, format.ChunkSize)
	}
	pending := make(chan chan result, cap(pool))
	go func() {
		defer close(pending)
		for i := range rec.Chunks {
			var buf []byte
			select {
			case buf = <-pool:
			case <-ctx.Done():
				return
			}
			c := make(chan result, 1)
			pending <- c // never blocks: as many slots as buffers
			go func() {
				off := int64(i) * format.ChunkSize
				b := buf[:min(format.ChunkSize, rec.Size-off)]
				_, err := in.ReadAt(b, off)
				if err != nil {
					err = fmt.Errorf("read the stick's disk image at bytes %d–%d: %w", off, off+int64(len(b)), err)
				} else {
					err = rec.CheckChunk(i, b)
				}
				c <- result{b, err}
			}()
		}
	}()
	i := 0
	for c := range pending {
		res := <-c
		if res.err == nil {
			res.err = write(i, res.b)
		}
		pool <- res.b[:cap(res.b)]
		if res.err != nil {
			return res.err
		}
		i++
	}
	return ctx.Err()
}

// zeros is made on first use, not at init: kiln serve links this package.
var zeros = sync.OnceValue(func() []byte { return make([]byte, blockdev.Chunk) })

func zero(b []byte) bool { return bytes.Equal(b, zeros()[:len(b)]) }

// readBack reads every byte of the target's first rec.Size back against
// the record.
func (r *reflasher) readBack(ctx context.Context, rec *format.Record, d *blockdev.Device) error {
	f, err := os.Open(d.Path)
	if err != nil {
		return fmt.Errorf("read back %s: %w: use another disk", d.Path, err)
	}
	defer f.Close()
	t := r.task("read back "+d.Path, rec.Size)
	err = rec.Check(ctx, f, t)
	t.Done(err)
	if err != nil {
		return fmt.Errorf("read back %s: %w: the disk did not keep what was written; run the reflash again, or use another disk", d.Path, err)
	}
	return nil
}
