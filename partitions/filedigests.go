package partitions

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"runtime"
	"sort"
	"sync"

	"golang.org/x/sync/errgroup"
)

// FileDigest is a file's size and sha256 ("sha256:…") as written into the
// image filesystem.
type FileDigest struct {
	Size   int64
	Digest string
}

// fileHasher is one file of the image filesystem being hashed in the order
// of its bytes as the partition is read front to back: its data is a list
// of extents (stored ranges of the partition, or sparse blocks: zeros).
type fileHasher struct {
	path     string
	size     int64
	start    int64 // where its first extent lies (sparse ones: where the next stored block would)
	extents  []fileExtent
	next     int   // the first extent not fully fed
	inExtent int64 // bytes of it fed
	fed      int64
	h        hash.Hash
}

type fileExtent struct {
	off, n int64 // in the partition; a sparse extent has off = where the next stored one begins
	sparse bool
}

// planFileHashes finds the extents of each path in the uncompressed
// filesystem s (errNotRaw if it is not one kiln reads raw).
func planFileHashes(s *rawSquashfs, paths []string) ([]*fileHasher, error) {
	var files []*fileHasher
	for _, p := range paths {
		in, err := s.lookup(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if in.typ != sqBasicFile && in.typ != sqExtFile {
			return nil, fmt.Errorf("%s: not a regular file", p)
		}
		f := &fileHasher{path: p, size: in.size, start: in.blocks, h: sha256.New()}
		pos := in.blocks
		for i, bs := range in.blockSizes {
			want := min(s.blockSize, in.size-int64(i)*s.blockSize)
			stored := int64(bs &^ sqDataUncompressed)
			switch {
			case stored == 0:
				f.extents = append(f.extents, fileExtent{off: pos, n: want, sparse: true})
				continue
			case bs&sqDataUncompressed == 0:
				return nil, errNotRaw
			case stored != want:
				return nil, fmt.Errorf("%s: block %d holds %d bytes, want %d: the filesystem is damaged", p, i, stored, want)
			case pos+stored > s.used:
				return nil, fmt.Errorf("%s: block %d lies past the end of the filesystem: it is damaged", p, i)
			}
			if k := len(f.extents) - 1; k >= 0 && !f.extents[k].sparse && f.extents[k].off+f.extents[k].n == pos {
				f.extents[k].n += stored // contiguous: one extent
			} else {
				f.extents = append(f.extents, fileExtent{off: pos, n: stored})
			}
			pos += stored
		}
		files = append(files, f)
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].start < files[j].start })
	return files, nil
}

// feed gives f the bytes of chunk (the partition's bytes at off) that are
// its own, in order, and says whether f is complete. It is called for each
// chunk in order from the one holding f's start on; a nil chunk feeds only
// sparse extents (after the last chunk).
func (f *fileHasher) feed(chunk []byte, off int64) (done bool) {
	end := off + int64(len(chunk))
	for f.next < len(f.extents) {
		e := f.extents[f.next]
		if e.sparse { // its stored bytes before it are fed: its zeros come now
			for n := e.n; n > 0; {
				c := min(n, int64(len(zeroBlock)))
				f.h.Write(zeroBlock[:c])
				n -= c
			}
			f.fed += e.n
			f.next++
			continue
		}
		from := e.off + f.inExtent
		if chunk == nil || from < off || from >= end {
			return false // not in this chunk (from < off: never read: the pass ends with an error)
		}
		to := min(e.off+e.n, end)
		f.h.Write(chunk[from-off : to-off])
		f.fed += to - from
		f.inExtent += to - from
		if f.inExtent < e.n {
			return false
		}
		f.next, f.inExtent = f.next+1, 0
	}
	return true
}

func (f *fileHasher) digest() FileDigest {
	return FileDigest{Size: f.size, Digest: "sha256:" + hex.EncodeToString(f.h.Sum(nil))}
}

// fileFeeder hands each chunk of the partition, in order, to the files
// whose bytes it holds.
type fileFeeder struct {
	files  []*fileHasher // by start
	next   int           // the first file not started
	active []*fileHasher
}

func (ff *fileFeeder) feed(chunk []byte, off int64) {
	end := off + int64(len(chunk))
	for ff.next < len(ff.files) && (chunk == nil || ff.files[ff.next].start < end) {
		ff.active = append(ff.active, ff.files[ff.next])
		ff.next++
	}
	keep := ff.active[:0]
	for _, f := range ff.active {
		if !f.feed(chunk, off) {
			keep = append(keep, f)
		}
	}
	ff.active = keep
}

// finish feeds what is left (files of sparse blocks only, after the last
// chunk) and returns the digests, or an error for a file whose bytes the
// pass did not reach.
func (ff *fileFeeder) finish() (map[string]FileDigest, error) {
	ff.feed(nil, 0)
	sums := make(map[string]FileDigest, len(ff.files))
	for _, f := range ff.files {
		if f.fed != f.size {
			return nil, fmt.Errorf("%s: %d of its %d bytes lie inside the filesystem: it is damaged", f.path, f.fed, f.size)
		}
		sums[f.path] = f.digest()
	}
	return sums, nil
}

// hashLevel0 is hashLevel for the data level, which also feeds ff (when not
// nil) every chunk read, in order: the blob check and the tree from one
// read of the partition. Chunks are read and hashed for the tree on every
// CPU; each is then fed to the files in turn (sha256 of a file is
// sequential), while the next chunks are read and hashed.
func hashLevel0(ctx context.Context, src io.ReaderAt, n int64, salt []byte, out io.WriterAt, dst int64, ff *fileFeeder, progress io.Writer) error {
	const chunkBlocks = 256 // 1 MiB: 8 KiB of digests, two whole hash blocks
	chunks := (n + chunkBlocks - 1) / chunkBlocks
	var (
		mu     sync.Mutex
		turn   = sync.NewCond(&mu)
		fedTo  int64 // chunks fed to the files so far
		failed bool
		claim  int64
	)
	g, gctx := errgroup.WithContext(ctx)
	// One worker more than CPUs: a worker waiting for its turn to feed the
	// files leaves its CPU to the spare one.
	for range runtime.GOMAXPROCS(0) + 1 {
		g.Go(func() (err error) {
			defer func() {
				if err != nil {
					mu.Lock()
					failed = true
					turn.Broadcast()
					mu.Unlock()
				}
			}()
			in := make([]byte, chunkBlocks*VerityBlock)
			hb := make([]byte, 0, chunkBlocks*verityDigest+VerityBlock)
			for {
				mu.Lock()
				k := claim
				claim++
				mu.Unlock()
				if k >= chunks {
					return nil
				}
				if err := gctx.Err(); err != nil {
					return err
				}
				from := k * chunkBlocks
				c := min(n-from, chunkBlocks)
				buf := in[:c*VerityBlock]
				if _, err := src.ReadAt(buf, from*VerityBlock); err != nil {
					return fmt.Errorf("read block %d for the verity tree: %w", from, err)
				}
				hb = hb[:0]
				for j := int64(0); j < c; j++ {
					hb = append(hb, saltedHash(salt, buf[j*VerityBlock:(j+1)*VerityBlock])...)
				}
				if pad := len(hb) % VerityBlock; pad != 0 { // only the level's last chunk
					hb = append(hb, make([]byte, VerityBlock-pad)...)
				}
				if _, err := out.WriteAt(hb, dst+from*verityDigest); err != nil {
					return fmt.Errorf("write verity tree: %w", err)
				}
				mu.Lock()
				for fedTo != k && !failed {
					turn.Wait()
				}
				if failed {
					mu.Unlock()
					return nil // the failing worker's error is the one returned
				}
				mu.Unlock()
				if ff != nil {
					ff.feed(buf, from*VerityBlock)
				}
				if progress != nil {
					progress.Write(buf)
				}
				mu.Lock()
				fedTo++
				turn.Broadcast()
				mu.Unlock()
			}
		})
	}
	return g.Wait()
}

// hashFiles is the files' digests read through fsys (a filesystem the
// verity pass cannot feed: compressed, or without verity), one reader per
// CPU, biggest files first.
func hashFiles(ctx context.Context, open func() (fs.FS, error), paths []string, progress io.Writer) (map[string]FileDigest, error) {
	sums := make(map[string]FileDigest, len(paths))
	var mu sync.Mutex
	next := make(chan string)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(next)
		for _, p := range paths {
			select {
			case next <- p:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range min(runtime.GOMAXPROCS(0), len(paths)) {
		g.Go(func() error {
			fsys, err := open()
			if err != nil {
				return err
			}
			buf := make([]byte, MiB)
			for p := range next {
				if err := gctx.Err(); err != nil {
					return err
				}
				d, err := hashFile(fsys, p, buf, progress)
				if err != nil {
					return err
				}
				mu.Lock()
				sums[p] = d
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return sums, nil
}

func hashFile(fsys fs.FS, p string, buf []byte, progress io.Writer) (FileDigest, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return FileDigest{}, err
	}
	defer f.Close()
	h := sha256.New()
	var w io.Writer = h
	if progress != nil {
		w = io.MultiWriter(h, progress)
	}
	n, err := io.CopyBuffer(w, struct{ io.Reader }{f}, buf)
	if err != nil {
		return FileDigest{}, fmt.Errorf("%s: %w", p, err)
	}
	return FileDigest{Size: n, Digest: "sha256:" + hex.EncodeToString(h.Sum(nil))}, nil
}
