package verity

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"runtime"

	"golang.org/x/sync/errgroup"

	kprogress "github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	godigest "github.com/opencontainers/go-digest"
)

// Files are files of the image filesystem hashed by the tree's read of the
// data level (Tree.Files): the blob check and the tree from one read of the
// partition.
type Files struct {
	files  []*fileHasher // by start
	next   int           // the first file not started
	active []*fileHasher
}

// NewFiles finds paths in the uncompressed filesystem raw, for Tree.Write
// to hash; squashfs.ErrNotRaw if one cannot be read raw.
func NewFiles(raw *squashfs.Raw, paths []string) (*Files, error) {
	files, err := raw.Files(paths) // sorted by start
	if err != nil {
		return nil, err
	}
	ff := &Files{}
	for _, f := range files {
		ff.files = append(ff.files, &fileHasher{File: f, h: sha256.New()})
	}
	return ff, nil
}

// fileHasher is one file being hashed in the order of its bytes as the
// partition is read front to back.
type fileHasher struct {
	squashfs.File
	next     int   // the first extent not fully fed
	inExtent int64 // bytes of it fed
	fed      int64
	h        hash.Hash
}

// zeros stand in for a sparse extent's bytes.
var zeros [64 << 10]byte

// feed gives f the bytes of chunk (the partition's bytes at off) that are
// its own, in order, and says whether f is complete. It is called for each
// chunk in order from the one holding f's start on; a nil chunk feeds only
// sparse extents (after the last chunk).
func (f *fileHasher) feed(chunk []byte, off int64) (done bool) {
	end := off + int64(len(chunk))
	for f.next < len(f.Extents) {
		e := f.Extents[f.next]
		if e.Sparse { // its stored bytes before it are fed: its zeros come now
			for n := e.N; n > 0; {
				c := min(n, int64(len(zeros)))
				f.h.Write(zeros[:c])
				n -= c
			}
			f.fed += e.N
			f.next++
			continue
		}
		from := e.Off + f.inExtent
		if chunk == nil || from < off || from >= end {
			return false // not in this chunk (from < off: never read: the pass ends with an error)
		}
		to := min(e.Off+e.N, end)
		f.h.Write(chunk[from-off : to-off])
		f.fed += to - from
		f.inExtent += to - from
		if f.inExtent < e.N {
			return false
		}
		f.next, f.inExtent = f.next+1, 0
	}
	return true
}

func (f *fileHasher) digest() squashfs.FileDigest {
	return squashfs.FileDigest{Size: f.Size, Digest: godigest.NewDigest(godigest.SHA256, f.h).String()}
}

// feed hands a chunk of the partition (chunks come in order) to the files
// whose bytes it holds.
func (ff *Files) feed(chunk []byte, off int64) {
	end := off + int64(len(chunk))
	for ff.next < len(ff.files) && (chunk == nil || ff.files[ff.next].Start < end) {
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

// Finish feeds what is left (files of sparse blocks only, after the last
// chunk) and returns the digests, or an error for a file whose bytes the
// pass did not reach.
func (ff *Files) Finish() (map[string]squashfs.FileDigest, error) {
	ff.feed(nil, 0)
	sums := make(map[string]squashfs.FileDigest, len(ff.files))
	for _, f := range ff.files {
		if f.fed != f.Size {
			return nil, fmt.Errorf("%s: %d of its %d bytes lie inside the filesystem: it is damaged", f.Path, f.fed, f.Size)
		}
		sums[f.Path] = f.digest()
	}
	return sums, nil
}

// writeData is write for the data level (src from byte 0), which also feeds
// ff (when not nil) from the same reads. The level is cut into regions of
// about 32 MiB at file starts, so each file lies in one region and its
// sha256 (sequential) is fed by the one worker that reads that region front
// to back, while the other regions are read and hashed on the other CPUs.
func (l level) writeData(ctx context.Context, out io.WriterAt, ff *Files, progress io.Writer) error {
	regions := dataRegions(l.n, ff)
	if progress != nil {
		progress = kprogress.Shared(progress) // one task, every worker
	}
	next := make(chan region)
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
			w := regionWorker{level: l, out: out, progress: progress,
				in: make([]byte, readChunk), // 1 MiB: 8 KiB of digests
				hb: make([]byte, 0, hashChunk*digest+Block),
				bh: newBlockHasher(l.salt)}
			for r := range next {
				if err := w.hash(gctx, r); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// region is blocks [from, to) of the data level for the tree, read on to
// readTo (bytes) for the files starting in it.
type region struct {
	from, to, readTo int64
	files            *Files
}

// dataRegions cuts n blocks into regions of about 32 MiB, each starting at
// the block of a file's start (files sorted by start: each ends before the
// next one starts, so a region's files end within one block past it).
func dataRegions(n int64, ff *Files) []region {
	const target = 8192 // blocks: 32 MiB
	var regions []region
	cur := region{files: &Files{}}
	if ff != nil {
		for _, f := range ff.files {
			b := f.Start / Block
			if b >= n {
				break // past the data: only sparse extents, fed by Finish
			}
			if b-cur.from >= target {
				cur.to = b
				regions = append(regions, cur)
				cur = region{from: b, files: &Files{}}
			}
			cur.files.files = append(cur.files.files, f)
			for _, e := range f.Extents {
				if !e.Sparse {
					cur.readTo = max(cur.readTo, e.Off+e.N)
				}
			}
		}
	}
	for cur.from+target < n && len(cur.files.files) == 0 { // no files: plain cuts
		cur.to = cur.from + target
		regions = append(regions, cur)
		cur = region{from: cur.to, files: &Files{}}
	}
	cur.to = n
	regions = append(regions, cur)
	for i := range regions {
		r := &regions[i]
		r.readTo = min(max(r.readTo, r.to*Block), n*Block)
	}
	return regions
}

// regionWorker is one CPU's share of writeData, with its buffers.
type regionWorker struct {
	level
	out      io.WriterAt
	progress io.Writer // nil: none
	in, hb   []byte
	bh       *blockHasher
}

// hash reads region r in 1 MiB chunks, writes the digests of its blocks at
// hashes+block*32 (the level's last region pads its hash block with zeros)
// and feeds each chunk to r's files.
func (w *regionWorker) hash(ctx context.Context, r region) error {
	for pos := r.from * Block; pos < r.readTo; {
		if err := ctx.Err(); err != nil {
			return err
		}
		buf := w.in[:min(int64(len(w.in)), (r.readTo+Block-1)/Block*Block-pos)]
		if _, err := w.src.ReadAt(buf, pos); err != nil {
			return fmt.Errorf("read block %d of the image partition: %w", pos/Block, err)
		}
		first := pos / Block
		blocks := min(int64(len(buf))/Block, r.to-first) // the tree: only the region's own blocks
		if blocks > 0 {
			hb := w.bh.appendBlocks(w.hb[:0], buf[:blocks*Block])
			if first+blocks == w.n {
				hb = w.pad(hb)
			}
			if _, err := w.out.WriteAt(hb, w.hashes+first*digest); err != nil {
				return fmt.Errorf("write verity tree: %w", err)
			}
			if w.progress != nil {
				w.progress.Write(buf[:blocks*Block])
			}
		}
		r.files.feed(buf, pos)
		pos += int64(len(buf))
	}
	return nil
}
