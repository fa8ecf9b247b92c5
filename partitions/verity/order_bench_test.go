package verity

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkHashOrder prices the ways a build could order its one write of
// the blobs into the disk file and its sha256 passes over them (the verity
// tree's 4 KiB leaves; on a cold build also each blob's digest), each timed
// to the fsync, as ratios against the order Assemble uses:
//
//   - copy, then hash: the kernel copies every file in (copy_file_range),
//     writeback starts, then every CPU reads the disk file back and hashes.
//   - hash behind: the same, but the hashers start with the copy and take
//     each 32 MiB region once the copy has passed it.
//   - hash on the way: a worker per CPU reads each file into memory, hashes
//     it there and writes that buffer, writeback kicked every 16 MiB.
//
// Files are laid out at 4 KiB boundaries, so a leaf never spans two files:
// the case most favourable to hashing on the way (squashfs packs files
// back to back). 1 GiB of random files of 14 and 25 MiB, as BenchmarkBuild's
// blobs; KILN_BENCH_ORDER_MIB sets another size.
func BenchmarkHashOrder(b *testing.B) {
	total := int64(1024)
	if s := os.Getenv("KILN_BENCH_ORDER_MIB"); s != "" {
		if _, err := fmt.Sscan(s, &total); err != nil {
			b.Fatalf("KILN_BENCH_ORDER_MIB: %v", err)
		}
	}
	dir := b.TempDir()
	files := orderFiles(b, dir, total<<20)
	disk := filepath.Join(dir, "disk")
	run := func(order func(out *os.File, files []orderFile, cold bool) error, cold bool) func() time.Duration {
		return func() time.Duration {
			os.Remove(disk)
			unix.Sync()
			start := time.Now()
			out, err := os.Create(disk)
			if err != nil {
				b.Fatal(err)
			}
			defer out.Close()
			if err := order(out, files, cold); err != nil {
				b.Fatal(err)
			}
			if err := out.Sync(); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
	}
	for _, cold := range []bool{false, true} {
		name := map[bool]string{false: "warm", true: "cold"}[cold]
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				behind := paired.Compare(b, paired.Runs, run(copyThenHash, cold), run(hashBehind, cold))
				onTheWay := paired.Compare(b, paired.Runs, run(copyThenHash, cold), run(hashOnTheWay, cold))
				paired.Report(b, "behind/then", behind)
				paired.Report(b, "ontheway/then", onTheWay)
				b.Logf("%d MiB, %s: copy then hash %v (median); hash behind / then %s; hash on the way / then %s; load average %s",
					total, name, paired.MedianDuration(behind.Baseline), behind, onTheWay, paired.LoadAverage())
			}
		})
	}
}

type orderFile struct {
	path     string
	size, at int64 // at: its place in the disk file, 4 KiB aligned
}

func orderFiles(b *testing.B, dir string, total int64) []orderFile {
	var files []orderFile
	buf := make([]byte, 1<<20)
	var at int64
	for i := 0; at < total; i++ {
		size := min(int64(14+11*(i%3/2))*mib+int64(i)*4099, total-at) // 14, 14, 25 MiB, not block multiples
		f := orderFile{path: filepath.Join(dir, fmt.Sprint("blob", i)), size: size, at: at}
		w, err := os.Create(f.path)
		if err != nil {
			b.Fatal(err)
		}
		for n := int64(0); n < size; n += int64(len(buf)) {
			rand.Read(buf)
			if _, err := w.Write(buf[:min(int64(len(buf)), size-n)]); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		files = append(files, f)
		at = (at + size + Block - 1) / Block * Block
	}
	return files
}

var orderSalt = make([]byte, 32)

// copyIn copies files into out in the kernel, calling done with the end of
// each chunk copied.
func copyIn(out *os.File, files []orderFile, done func(pos int64)) error {
	for _, f := range files {
		in, err := os.Open(f.path)
		if err != nil {
			return err
		}
		for off := int64(0); off < f.size; {
			roff, woff := off, f.at+off
			n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(f.size-off, 16<<20)), 0)
			if err != nil || n == 0 {
				in.Close()
				return fmt.Errorf("copy_file_range %s: %d, %v", f.path, n, err)
			}
			off += int64(n)
			done(f.at + off)
		}
		in.Close()
	}
	return nil
}

// hashBack reads out back region by region on every CPU, hashing each leaf
// and (cold) each file's bytes; ready blocks until a region is written.
func hashBack(out *os.File, files []orderFile, cold bool, ready func(end int64)) error {
	const region = 32 << 20
	last := files[len(files)-1]
	end := last.at + last.size
	return onEveryCPU(int((end+region-1)/region), func(w *orderWorker, i int) error {
		from := int64(i) * region
		to := min(from+region, end)
		ready(to)
		for p := from; p < to; p += int64(len(w.buf)) {
			n, err := out.ReadAt(w.buf[:min(int64(len(w.buf)), to-p)], p)
			if err != nil {
				return err
			}
			w.leaves = w.bh.appendBlocks(w.leaves[:0], w.buf[:n])
			if cold { // the files' digests: one state stands in for each file's
				w.blob.Write(w.buf[:n])
			}
		}
		return nil
	})
}

// orderWorker is one CPU's buffers and hash states, made once per run.
type orderWorker struct {
	bh     *blockHasher
	blob   hash.Hash
	leaves []byte
	buf    []byte
}

// onEveryCPU calls work for 0 … n-1, in that order of start, on one
// goroutine per CPU, and returns the first error.
func onEveryCPU(n int, work func(w *orderWorker, i int) error) error {
	var next atomic.Int64
	var g errgroup.Group
	for range runtime.GOMAXPROCS(0) {
		g.Go(func() error {
			w := &orderWorker{bh: newBlockHasher(orderSalt), blob: sha256.New(),
				leaves: make([]byte, 0, 256*digest), buf: make([]byte, 1<<20)}
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := work(w, i); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

func copyThenHash(out *os.File, files []orderFile, cold bool) error {
	if err := copyIn(out, files, func(int64) {}); err != nil {
		return err
	}
	go unix.SyncFileRange(int(out.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
	return hashBack(out, files, cold, func(int64) {})
}

func hashBehind(out *os.File, files []orderFile, cold bool) error {
	var mu sync.Mutex
	written := sync.NewCond(&mu)
	var pos int64
	copied := make(chan error, 1)
	go func() {
		err := copyIn(out, files, func(p int64) { mu.Lock(); pos = p; mu.Unlock(); written.Broadcast() })
		mu.Lock()
		pos = 1 << 62 // done (or failed): release every waiter
		mu.Unlock()
		written.Broadcast()
		unix.SyncFileRange(int(out.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		copied <- err
	}()
	err := hashBack(out, files, cold, func(end int64) {
		mu.Lock()
		for pos < end {
			written.Wait()
		}
		mu.Unlock()
	})
	if cerr := <-copied; cerr != nil {
		return cerr
	}
	return err
}

func hashOnTheWay(out *os.File, files []orderFile, cold bool) error {
	return onEveryCPU(len(files), func(w *orderWorker, i int) error {
		f := files[i]
		in, err := os.Open(f.path)
		if err != nil {
			return err
		}
		defer in.Close()
		w.blob.Reset()
		for off := int64(0); off < f.size; {
			n, err := in.ReadAt(w.buf[:min(int64(len(w.buf)), f.size-off)], off)
			if n == 0 {
				return fmt.Errorf("read %s: %v", f.path, err)
			}
			w.leaves = w.bh.appendBlocks(w.leaves[:0], w.buf[:n])
			if cold {
				w.blob.Write(w.buf[:n])
			}
			if _, err := out.WriteAt(w.buf[:n], f.at+off); err != nil {
				return err
			}
			if (off+int64(n))/(16<<20) > off/(16<<20) { // start writeback of each 16 MiB written
				unix.SyncFileRange(int(out.Fd()), f.at+off-(16<<20)+int64(n), 16<<20, unix.SYNC_FILE_RANGE_WRITE)
			}
			off += int64(n)
		}
		return nil
	})
}
