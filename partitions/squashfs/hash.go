package squashfs

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"runtime"
	"sync"

	"golang.org/x/sync/errgroup"

	kprogress "github.com/kiln-appliance/kiln/internal/progress"
	"github.com/opencontainers/go-digest"
)

// FileDigest is a file's size and sha256 ("sha256:…") as written into the
// image filesystem.
type FileDigest struct {
	Size   int64
	Digest string
}

// HashFiles is the size and sha256 of each of paths, read through the
// filesystems open returns (one per reader, a reader per CPU).
func HashFiles(ctx context.Context, open func() (fs.FS, error), paths []string, progress io.Writer) (map[string]FileDigest, error) {
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
			buf := make([]byte, 1<<20)
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
	return FileDigest{Size: n, Digest: digest.NewDigest(digest.SHA256, h).String()}, nil
}
