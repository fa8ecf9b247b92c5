package bundle

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
)

// chunkHasher hashes the filesystem's chunks while mksquashfs writes it, so
// the bundle costs one write, not a write and a read. mksquashfs writes its
// data and tables in order, each once, and the 96-byte superblock at the
// filesystem's start last: chunk 0 is hashed only when it has finished, the
// others as soon as the file has grown lag bytes past their end.
type chunkHasher struct {
	f     *os.File
	start int64 // the filesystem's offset in f
	size  int64 // chunk size
	lag   int64 // how far behind the file's end it stays
	w     io.Writer

	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	chunks []string // chunks[0] is filled last
	err    error
	early  int // chunks hashed while the filesystem was being written
}

// defaultLag keeps the hasher well behind mksquashfs's write position.
const defaultLag = 8 << 20

func startChunkHasher(f *os.File, start, chunkSize, lag int64, progress io.Writer) *chunkHasher {
	h := &chunkHasher{f: f, start: start, size: chunkSize, lag: lag, w: progress, stop: make(chan struct{}), done: make(chan struct{}), chunks: []string{""}}
	go h.run()
	return h
}

func (h *chunkHasher) run() {
	defer close(h.done)
	buf := make([]byte, 1<<20)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
		st, err := h.f.Stat()
		if err != nil {
			continue
		}
		for h.err == nil {
			next := int64(len(h.chunks))
			end := (next + 1) * h.size
			if h.start+end+h.lag > st.Size() {
				break
			}
			h.hash(next, h.size, buf)
		}
	}
}

// hash hashes chunk i of n bytes and appends it.
func (h *chunkHasher) hash(i, n int64, buf []byte) {
	sum, err := bundle.HashRange(h.f, h.start+i*h.size, n, h.w, buf)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.err = err
		return
	}
	if i == 0 {
		h.chunks[0] = sum
	} else {
		h.chunks = append(h.chunks, sum)
	}
}

// finish waits for the hasher, hashes what is left of a filesystem of size
// bytes (0 when writing it failed) and chunk 0, and returns every chunk's
// digest.
func (h *chunkHasher) finish(size int64) ([]string, error) {
	close(h.stop)
	<-h.done
	h.early = len(h.chunks) - 1
	if size == 0 || h.err != nil {
		return nil, h.err
	}
	buf := make([]byte, 1<<20)
	for i := int64(len(h.chunks)); i*h.size < size && h.err == nil; i++ {
		h.hash(i, min(h.size, size-i*h.size), buf)
	}
	if h.err == nil {
		h.hash(0, min(h.size, size), buf)
	}
	if h.err != nil {
		return nil, h.err
	}
	// The tail hasher may have hashed whole chunks past a smaller end:
	// impossible, as it stays lag behind the file's end, which only grows.
	return h.chunks[:(size+h.size-1)/h.size], nil
}
