package bundleimport

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
)

// incomingDir holds blobs taken from a bundle, each verified against the
// signed manifest and durable, until the state machine moves them into the
// store under its lock. It is beside blobs/, not in it: the machine's
// collection removes from blobs/ whatever no kept release lists, and an
// import running outside the lock must not lose its blobs to it. A stick
// pulled mid-import leaves what it finished here for the next plug.
const incomingDir = "incoming"

// part is a byte range of the bundle's filesystem the store lacks: a blob
// or a release file's contents, at the offset the signed manifest gives.
type part struct {
	digest       string
	offset, size int64
}

// errDamaged marks a receive failure that proves the bundle wrong (a part
// that does not hash as signed), as opposed to a stick that went away: the
// import refuses it and keeps nothing.
type errDamaged struct{ error }

func (e errDamaged) Unwrap() error { return e.error }

// receive copies each wanted part of the bundle's filesystem (src from
// fsStart) into a temp file in dir, in the kernel (sendfile, as cp does),
// and hashes the copy — not the stick — against the signed digest. Copying
// the next part overlaps hashing the last, on the other core. The stick is
// read once and never parsed: the parts' places come from the signed
// manifest, and the kernel never mounts it; what is hashed is the private
// copy that is kept, so a device that answers a second read differently
// has no second read to answer.
//
// Only when every part matched are the parts made durable (one syncfs),
// renamed to their digests and the directory synced. A damaged part
// (errDamaged) keeps nothing. A read that fails (the stick pulled) or a stop
// keeps the parts finished before it, each verified, for the next run.
//
// progress must be safe for concurrent writes (a progress.Task is).
func (i *importer) receive(ctx context.Context, src *os.File, fsStart int64, dir string, wants []part, progress io.Writer) error {
	unlock, err := atomicfile.LockDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	if err := removeTemps(dir); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type copied struct {
		part
		tmp *os.File
	}
	toHash := make(chan copied, 1)
	var (
		mu      sync.Mutex // guards done, hashErr
		done    []finished
		hashErr error
		wg      sync.WaitGroup
	)
	// A hasher per core: hashing is the import's one cost beyond cp's.
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for c := range toHash {
				mu.Lock()
				failed := hashErr != nil
				mu.Unlock()
				if failed {
					discard(c.tmp)
					continue
				}
				f, err := verify(c.tmp, c.part, buf, progress)
				mu.Lock()
				if err != nil && hashErr == nil {
					hashErr = err
					cancel()
				}
				if err == nil {
					done = append(done, f)
				}
				mu.Unlock()
			}
		}()
	}
	var readErr error
	for _, w := range wants {
		if readErr = ctx.Err(); readErr != nil {
			break
		}
		i.copying(w.digest)
		var tmp *os.File
		if tmp, readErr = copyPart(ctx, src, fsStart, dir, w); readErr != nil {
			break
		}
		toHash <- copied{w, tmp}
	}
	close(toHash)
	wg.Wait()

	c := commit{dir: dir, done: done}
	defer c.removeTemps()
	switch {
	case hashErr != nil:
		return hashErr // damaged, or the store failed: keep nothing of this run
	case readErr != nil:
		if err := c.commit(); err != nil {
			return errors.Join(readErr, err)
		}
		return readErr
	}
	return c.commit()
}

// copyPart copies w's bytes into a new temp file in dir, in the kernel, in
// steps short enough to stop soon when ctx is done.
func copyPart(ctx context.Context, src *os.File, fsStart int64, dir string, w part) (*os.File, error) {
	_, hx, _ := strings.Cut(w.digest, ":")
	tmp, err := os.CreateTemp(dir, "."+hx+tempMark+"*")
	if err != nil {
		return nil, fmt.Errorf("release store: %w", err)
	}
	off, left := fsStart+w.offset, w.size
	for left > 0 {
		if err := ctx.Err(); err != nil {
			discard(tmp)
			return nil, err
		}
		n, err := unix.Sendfile(int(tmp.Fd()), int(src.Fd()), &off, int(min(left, 16<<20)))
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err == nil && n == 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			discard(tmp)
			return nil, fmt.Errorf("read the stick at byte %d (was it removed?): %w", off, err)
		}
		left -= int64(n)
	}
	// Start writing it to disk now, while the next parts are copied and
	// hashed, rather than all at the final syncfs (which still waits for it).
	unix.SyncFileRange(int(tmp.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE) //nolint:errcheck // a hint; syncfs reports errors
	return tmp, nil
}

// verify hashes the copy in tmp (from the page cache: it was just written)
// against w's digest, copying what it reads to progress.
func verify(tmp *os.File, w part, buf []byte, progress io.Writer) (finished, error) {
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(h, progress), io.NewSectionReader(tmp, 0, w.size+1), buf)
	if err == nil {
		err = tmp.Close()
	}
	if err != nil {
		discard(tmp)
		return finished{}, fmt.Errorf("release store: %w", err)
	}
	alg, want, _ := strings.Cut(w.digest, ":")
	if got := hex.EncodeToString(h.Sum(nil)); n != w.size || alg != "sha256" || got != want {
		os.Remove(tmp.Name())
		return finished{}, errDamaged{fmt.Errorf("%w: blob %s reads as sha256:%s (%d bytes at %d of the filesystem)", bundle.ErrDamaged, w.digest, got, w.size, w.offset)}
	}
	return finished{tmp: tmp.Name(), name: want}, nil
}

func discard(f *os.File) {
	f.Close()
	os.Remove(f.Name())
}

type finished struct{ tmp, name string }

// commit makes finished parts durable and visible.
type commit struct {
	dir  string
	done []finished
}

// commit: one syncfs for all their bytes, then each renamed to its digest,
// then the directory synced. A part is thus never under its digest's name
// before its bytes are on disk.
func (c *commit) commit() error {
	if len(c.done) == 0 {
		return nil
	}
	d, err := os.Open(c.dir)
	if err != nil {
		return fmt.Errorf("release store: %w", err)
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("release store: sync: %w", err)
	}
	for len(c.done) > 0 {
		f := c.done[0]
		if err := os.Rename(f.tmp, filepath.Join(c.dir, f.name)); err != nil {
			return fmt.Errorf("release store: %w", err)
		}
		c.done = c.done[1:]
	}
	return atomicfile.SyncDir(c.dir)
}

// removeTemps removes what was not committed.
func (c *commit) removeTemps() {
	for _, f := range c.done {
		os.Remove(f.tmp)
	}
}

// tempMark is in every temp file's name: .<hex>.tmp-<random>.
const tempMark = ".tmp-"

// removeTemps removes temp files a killed import left in dir (the caller
// holds dir's lock, so none is being written).
func removeTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("release store: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") && strings.Contains(e.Name(), tempMark) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("release store: %w", err)
			}
		}
	}
	return nil
}
