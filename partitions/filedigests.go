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

	kprogress "github.com/kiln-appliance/kiln/internal/progress"
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

// hashLevel0 is hashLevel for the data level, which also feeds the files of
// ff (when not nil) from the same reads: the blob check and the tree from one
// read of the partition. The level is cut into regions of about 32 MiB at
// file starts, so each file lies in one region and its sha256 (sequential)
// is fed by the one worker that reads that region front to back, while the
// other regions are read and hashed on the other CPUs.
func hashLevel0(ctx context.Context, src io.ReaderAt, n int64, salt []byte, out io.WriterAt, dst int64, ff *fileFeeder, progress io.Writer) error {
	regions := levelRegions(n, ff)
	if progress != nil {
		progress = kprogress.Shared(progress) // one task, every worker
	}
	next := make(chan levelRegion)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(next)
		for _, r := range regions {
			select {
			case next <- r:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range min(runtime.GOMAXPROCS(0), len(regions)) {
		g.Go(func() error {
			in := make([]byte, 256*VerityBlock) // 1 MiB: 8 KiB of digests
			hb := make([]byte, 0, 256*verityDigest+VerityBlock)
			bh := newBlockHasher(salt)
			for r := range next {
				if err := hashRegion(gctx, src, n, bh, out, dst, r, in, hb, progress); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// levelRegion is blocks [from, to) of the data level for the tree, read on
// to readTo (bytes) for the files starting in it.
type levelRegion struct {
	from, to, readTo int64
	files            *fileFeeder
}

// levelRegions cuts n blocks into regions of about 32 MiB, each starting at
// the block of a file's start (files sorted by start: each ends before the
// next one starts, so a region's files end within one block past it).
func levelRegions(n int64, ff *fileFeeder) []levelRegion {
	const target = 8192 // blocks: 32 MiB
	var regions []levelRegion
	cur := levelRegion{files: &fileFeeder{}}
	if ff != nil {
		for _, f := range ff.files {
			b := f.start / VerityBlock
			if b >= n {
				break // past the data: only sparse extents, fed by finish
			}
			if b-cur.from >= target {
				cur.to = b
				regions = append(regions, cur)
				cur = levelRegion{from: b, files: &fileFeeder{}}
			}
			cur.files.files = append(cur.files.files, f)
			for _, e := range f.extents {
				if !e.sparse {
					cur.readTo = max(cur.readTo, e.off+e.n)
				}
			}
		}
	}
	for cur.from+target < n && len(cur.files.files) == 0 { // no files: plain cuts
		cur.to = cur.from + target
		regions = append(regions, cur)
		cur = levelRegion{from: cur.to, files: &fileFeeder{}}
	}
	cur.to = n
	regions = append(regions, cur)
	for i := range regions {
		r := &regions[i]
		r.readTo = min(max(r.readTo, r.to*VerityBlock), n*VerityBlock)
	}
	return regions
}

// hashRegion reads region r in 1 MiB chunks, writes the digests of its
// blocks at dst+block*32 (the level's last region pads its hash block with
// zeros) and feeds each chunk to r's files.
func hashRegion(ctx context.Context, src io.ReaderAt, n int64, bh *blockHasher, out io.WriterAt, dst int64, r levelRegion, in, hb []byte, progress io.Writer) error {
	for pos := r.from * VerityBlock; pos < r.readTo; {
		if err := ctx.Err(); err != nil {
			return err
		}
		buf := in[:min(int64(len(in)), alignUp(r.readTo, VerityBlock)-pos)]
		if _, err := src.ReadAt(buf, pos); err != nil {
			return fmt.Errorf("read block %d of the image partition: %w", pos/VerityBlock, err)
		}
		first := pos / VerityBlock
		blocks := min(int64(len(buf))/VerityBlock, r.to-first) // the tree: only the region's own blocks
		if blocks > 0 {
			hb = bh.appendBlocks(hb[:0], buf[:blocks*VerityBlock])
			if first+blocks == n {
				if pad := (n * verityDigest) % VerityBlock; pad != 0 {
					hb = append(hb, make([]byte, VerityBlock-pad)...)
				}
			}
			if _, err := out.WriteAt(hb, dst+first*verityDigest); err != nil {
				return fmt.Errorf("write verity tree: %w", err)
			}
			if progress != nil {
				progress.Write(buf[:blocks*VerityBlock])
			}
		}
		r.files.feed(buf, pos)
		pos += int64(len(buf))
	}
	return nil
}

// hashFiles is the files' digests read through fsys (a filesystem the
// verity pass cannot feed: compressed, or without verity), one reader per
// CPU, biggest files first.
func hashFiles(ctx context.Context, open func() (fs.FS, error), paths []string, progress io.Writer) (map[string]FileDigest, error) {
	sums := make(map[string]FileDigest, len(paths))
	if progress != nil {
		progress = kprogress.Shared(progress) // one task, every reader
	}
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
