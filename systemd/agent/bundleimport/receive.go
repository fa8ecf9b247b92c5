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
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// incomingDir holds blobs taken from a bundle, each verified against the
// signed manifest and durable, until the state machine moves them into the
// store under its lock. It is beside blobs/, not in it: the machine's
// collection removes from blobs/ whatever no kept release lists, and an
// import running outside the lock must not lose its blobs to it. A stick
// pulled mid-import leaves what it finished here for the next plug; the
// next import of another release removes them, so incoming never holds more
// than one release's unfinished import.
const incomingDir = "incoming"

// part is a byte range of the bundle's filesystem the store lacks: a blob
// or a release file's contents, at the offset the signed manifest gives.
type part struct {
	digest       string
	offset, size int64
}

// bundleFS is the bundle's filesystem on the stick: the stick (or bundle
// file) and the byte the filesystem starts at.
type bundleFS struct {
	f     *os.File
	start int64
}

// inbox is where receive puts the parts: the directory, and the digests of
// every blob the release being imported keeps.
type inbox struct {
	dir  string
	keep []string
}

// receive copies each wanted part of the bundle's filesystem into a temp
// file in the inbox's directory: it reads the part into memory, hashes
// those bytes and writes the same bytes, with O_DIRECT where the filesystem
// allows it (no second copy into the page cache, nothing left to flush at
// the end), while the next bytes are read and hashed. The stick is read
// once and never parsed: the parts' places come from the signed manifest,
// and the kernel never mounts it; what is hashed is exactly what is kept, so
// a device that answers a second read differently has no second read to
// answer.
//
// Anything finished in the directory that the inbox does not keep
// (another release's pulled stick) is removed first.
//
// Only when every part matched are the parts made durable (one syncfs),
// renamed to their digests and the directory synced. A damaged part
// (bundlefmt.ErrDamaged) keeps nothing. A read that fails (the stick pulled) or a stop
// keeps the parts finished before it, each verified, for the next run.
func (i *importer) receive(ctx context.Context, src bundleFS, in inbox, wants []part, progress io.Writer) (err error) {
	dir := in.dir
	unlock, err := atomicfile.LockDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	if err := sweepIncoming(dir, in.keep); err != nil {
		return err
	}
	pool := make(chan []byte, 4)
	for range cap(pool) {
		b, err := unix.Mmap(-1, 0, ioSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("buffers: %w", err)
		}
		defer unix.Munmap(b) //nolint:errcheck // at exit
		pool <- b            // page-aligned, as O_DIRECT needs
	}
	w := &writer{pool: pool, jobs: make(chan job, cap(pool))}
	w.wg.Add(1)
	go w.run()

	var readErr, damaged error
	for _, p := range wants {
		if readErr = ctx.Err(); readErr != nil {
			break
		}
		i.copying(p.digest)
		if readErr, damaged = w.part(ctx, src, dir, p, progress); readErr != nil || damaged != nil {
			break
		}
	}
	close(w.jobs)
	w.wg.Wait()

	c := commit{dir: dir, done: w.done}
	defer c.removeTemps()
	switch {
	case damaged != nil:
		return damaged // keep nothing of this run
	case w.err != nil:
		return w.err // the store failed: keep nothing of this run
	case readErr != nil:
		if err := c.commit(); err != nil {
			return errors.Join(readErr, err)
		}
		return readErr
	}
	return c.commit()
}

// ioSize is the size of one read and one write.
const ioSize = 4 << 20

// writer writes parts' bytes, read and hashed by receive, to their temp
// files, one job after another.
type writer struct {
	pool chan []byte
	jobs chan job
	wg   sync.WaitGroup
	done []finished // parts written whole and verified
	err  error      // the first write that failed
}

// job is the next bytes of a part's temp file, or (end) the part's end.
type job struct {
	f        *os.File
	off      int64
	b        []byte // from the pool, returned once written
	n        int    // bytes of b that belong to the part
	end      bool
	size     int64 // at the end: the part's size
	verified bool  // at the end: its digest matched
	name     string
}

func (w *writer) run() {
	defer w.wg.Done()
	for j := range w.jobs {
		switch {
		case !j.end && w.err == nil:
			// O_DIRECT writes whole 4 KiB blocks: the last one is cut back
			// by the truncate at the end.
			k := (j.n + 4095) &^ 4095
			clear(j.b[j.n:k])
			if _, err := j.f.WriteAt(j.b[:k], j.off); err != nil {
				w.err = fmt.Errorf("release store: %w", err)
			}
		case j.end:
			err := w.err
			if err == nil {
				err = j.f.Truncate(j.size)
			}
			if cerr := j.f.Close(); err == nil {
				err = cerr
			}
			if err != nil && w.err == nil {
				w.err = fmt.Errorf("release store: %w", err)
			}
			if err != nil || !j.verified {
				os.Remove(j.f.Name())
				continue
			}
			w.done = append(w.done, finished{tmp: j.f.Name(), name: j.name})
		}
		if j.b != nil {
			w.pool <- j.b
		}
	}
}

// part reads p's bytes from src, hashes them and hands them to the writer,
// then checks the digest. It returns a read error (the stick, a stop) or a
// damaged part.
func (w *writer) part(ctx context.Context, src bundleFS, dir string, p part, progress io.Writer) (readErr, damaged error) {
	fsStart := src.start
	alg, hx, _ := strings.Cut(p.digest, ":")
	f, err := createDirect(dir, "."+hx+tempMark+"*")
	if err != nil {
		return err, nil
	}
	h := sha256.New()
	var off int64
	for off < p.size {
		if err := ctx.Err(); err != nil {
			w.jobs <- job{f: f, end: true}
			return err, nil
		}
		b := <-w.pool
		n, err := src.f.ReadAt(b[:min(ioSize, p.size-off)], fsStart+p.offset+off)
		if err != nil && !(errors.Is(err, io.EOF) && int64(n) == min(ioSize, p.size-off)) {
			w.pool <- b
			w.jobs <- job{f: f, end: true}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("read the stick at byte %d (was it removed?): %w", fsStart+p.offset+off+int64(n), err), nil
		}
		h.Write(b[:n])
		progress.Write(b[:n]) //nolint:errcheck // counts
		w.jobs <- job{f: f, off: off, b: b, n: n}
		off += int64(n)
	}
	got := hex.EncodeToString(h.Sum(nil))
	ok := alg == "sha256" && got == hx
	w.jobs <- job{f: f, end: true, size: p.size, verified: ok, name: hx}
	if !ok {
		return nil, fmt.Errorf("%w: blob %s reads as sha256:%s (%d bytes at %d of the filesystem)", bundlefmt.ErrDamaged, p.digest, got, p.size, p.offset)
	}
	return nil, nil
}

// createDirect creates a temp file in dir open for O_DIRECT writes, or for
// ordinary ones where the filesystem refuses O_DIRECT (tmpfs).
func createDirect(dir, pattern string) (*os.File, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, fmt.Errorf("release store: %w", err)
	}
	// CreateTemp makes 0600 files; the registry serving the store runs as a
	// dynamic user (kiln-registry.service) and must read them.
	if err := f.Chmod(blobMode); err != nil {
		discard(f)
		return nil, fmt.Errorf("release store: %w", err)
	}
	d, err := os.OpenFile(f.Name(), os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		return f, nil
	}
	f.Close()
	return d, nil
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

// blobMode is a stored blob's mode: readable by the registry's dynamic user.
const blobMode = 0o644

// tempMark is in every temp file's name: .<hex>.tmp-<random>.
const tempMark = ".tmp-"

// sweepIncoming removes from dir the temp files a killed import left and
// the blobs no digest in keep names (the caller holds dir's lock, so none
// is being written).
func sweepIncoming(dir string, keep []string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("release store: %w", err)
	}
	kept := map[string]bool{}
	for _, d := range keep {
		_, hx, _ := strings.Cut(d, ":")
		kept[hx] = true
	}
	for _, e := range entries {
		if !kept[e.Name()] {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("release store: %w", err)
			}
		}
	}
	return nil
}
