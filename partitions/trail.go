package partitions

import (
	"crypto/sha256"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/kiln-appliance/kiln/partitions/sqfswrite"
)

// trailGate follows kiln's squashfs writer (sqfswrite's passed) so the
// verity pass and the blob check can read what is final behind it while it
// writes the rest: the bytes hashed are still the bytes written, read back
// from the disk file, only earlier.
type trailGate struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pos     int64 // every byte before it is final, but the first block
	started bool  // the writer has checked the file: bytes past it may be written
	done    bool
	err     error
}

func newTrailGate() *trailGate {
	g := &trailGate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *trailGate) passed(pos int64) {
	g.mu.Lock()
	g.started = true
	if pos > g.pos {
		g.pos = pos
	}
	g.mu.Unlock()
	g.cond.Broadcast()
}

func (g *trailGate) finish(err error) {
	g.mu.Lock()
	g.done, g.err = true, err
	g.mu.Unlock()
	g.cond.Broadcast()
}

// waitStarted returns once bytes past the filesystem may be written (or
// the writer failed before).
func (g *trailGate) waitStarted() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.started && !g.done {
		g.cond.Wait()
	}
	return g.err
}

// wait returns once the writer is done, with its error.
func (g *trailGate) wait() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.done {
		g.cond.Wait()
	}
	return g.err
}

// trailReader reads the filesystem (r, from its start) no faster than the
// writer finishes it. The first block (the superblock) is written last.
type trailReader struct {
	g *trailGate
	r io.ReaderAt
}

func (t trailReader) ReadAt(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	g := t.g
	g.mu.Lock()
	for !g.done && (off < VerityBlock || end > g.pos) {
		g.cond.Wait()
	}
	done, err := g.done, g.err
	g.mu.Unlock()
	if done && err != nil {
		return 0, fmt.Errorf("the image filesystem was not written: %w", err)
	}
	n, err := t.r.ReadAt(p, off)
	if err == io.EOF && !done {
		// Behind the writer, but past the file's end so far: a source's
		// trailing hole, zeros once the filesystem is padded.
		clear(p[n:])
		return len(p), nil
	}
	return n, err
}

// plannedFileHashes is planFileHashes for a filesystem not yet written:
// sqfswrite stores each file as one run of bytes at a known place.
func plannedFileHashes(plan *sqfswrite.Plan, paths []string) (*fileFeeder, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	var files []*fileHasher
	for _, p := range paths {
		f, ok := plan.File(p)
		if !ok {
			return nil, fmt.Errorf("read back the image filesystem: %s: not a regular file of it", p)
		}
		h := &fileHasher{path: p, size: f.Size, start: f.Offset, h: sha256.New()}
		if f.Size > 0 {
			h.extents = []fileExtent{{off: f.Offset, n: f.Size}}
		}
		files = append(files, h)
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].start < files[j].start })
	return &fileFeeder{files: files}, nil
}
