package fetch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/singleflight"

	"github.com/kiln-appliance/kiln/builder/internal/leftover"
)

// Cache is a content-addressed store of blobs, shared by every build on the
// host: blobs/sha256/<hex>, the same shape as an OCI layout's blobs. A file
// appears under its digest only once its bytes have been checked, so a blob
// that is present is trusted (Verify re-checks one on demand).
type Cache struct {
	dir        string
	flight     singleflight.Group // one download per blob within this process
	stall      time.Duration      // how long a blob's source may send nothing
	probeState                    // how a new cached blob looks (inplace.go)
}

// DefaultDir is $XDG_CACHE_HOME/kiln, or ~/.cache/kiln.
func DefaultDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kiln")
	}
	return filepath.Join(os.TempDir(), "kiln-cache")
}

// Open opens (creating it if needed) the cache at dir.
func Open(dir string) (*Cache, error) {
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, fmt.Errorf("open blob cache: %w (set XDG_CACHE_HOME or --cache to a writable directory)", err)
	}
	for _, d := range []string{blobs, filepath.Join(dir, "checked", "sha256")} {
		leftover.Sweep(d, tempPrefix) // best effort: a temp kept costs space, not correctness
		removeStaleTemps(d)
	}
	return &Cache{dir: dir, stall: stallTimeout}, nil
}

// staleAfter is how long a temp file without its owner's tag (written by a
// kiln before temps carried one: leftover.Pattern) goes unwritten before
// it is taken for the leftover of a killed kiln. (A live fetch writes to
// its file all the time, so its modification time stays fresh.) Tagged
// temps are removed as soon as their owner is dead (leftover.Sweep).
const staleAfter = time.Hour

func removeStaleTemps(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tempPrefix) || leftover.Tagged(e.Name(), tempPrefix) {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleAfter {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Dir is the cache's root directory.
func (c *Cache) Dir() string { return c.dir }

// Path is where blob h lives (or would live) in the cache.
func (c *Cache) Path(h v1.Hash) string {
	return filepath.Join(c.dir, "blobs", h.Algorithm, h.Hex)
}

// Has reports whether blob d is in the cache with the right size.
func (c *Cache) Has(d v1.Descriptor) bool {
	fi, err := os.Stat(c.Path(d.Digest))
	return err == nil && fi.Mode().IsRegular() && fi.Size() == d.Size
}

// put stores blob d, read from open, unless it is already cached. The bytes
// stream through a hash into a temp file beside the final name, which is
// renamed into place only if size and digest match: a failed, corrupt or
// cancelled fetch leaves nothing behind, and concurrent writers of the same
// blob (other builds on the host) each rename a complete file. what names
// the image for errors; progress (may be nil) counts bytes.
func (c *Cache) put(ctx context.Context, d v1.Descriptor, what string, open func(context.Context) (io.ReadCloser, error), progress io.Writer) error {
	if d.Digest.Algorithm != "sha256" {
		return fmt.Errorf("%w: %s: blob %s: only sha256 digests are supported", ErrBadSource, what, d.Digest)
	}
	_, err, _ := c.flight.Do(d.Digest.Hex, func() (any, error) {
		if c.Has(d) {
			return nil, nil
		}
		return nil, c.write(ctx, d, what, open, progress)
	})
	return err
}

func (c *Cache) write(ctx context.Context, d v1.Descriptor, what string, open func(context.Context) (io.ReadCloser, error), progress io.Writer) (err error) {
	if progress == nil {
		progress = io.Discard
	}
	// A source that stops sending is given up on, rather than waited for
	// forever: every read pushes the deadline back.
	ctx, stalled := context.WithCancelCause(ctx)
	defer stalled(nil)
	watchdog := time.AfterFunc(c.stall, func() { stalled(errStalled) })
	defer watchdog.Stop()

	rc, err := open(ctx)
	if err != nil {
		if context.Cause(ctx) == errStalled {
			return fmt.Errorf("%w: %s: blob %s: no answer for %v; the registry or the network is stuck, try again", ErrUnreachable, what, d.Digest, c.stall)
		}
		return err
	}
	defer rc.Close()

	tmp, err := os.CreateTemp(filepath.Dir(c.Path(d.Digest)), leftover.Pattern(tempPrefix))
	if err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()

	h := sha256.New()
	// Read one byte past the expected size, so an oversized blob is caught
	// without reading all of it.
	n, err := io.Copy(io.MultiWriter(tmp, h, progress), ctxReader{ctx, io.LimitReader(rc, d.Size+1), watchdog, c.stall})
	got := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	switch {
	case context.Cause(ctx) == errStalled:
		return fmt.Errorf("%w: %s: blob %s: no data for %v after %d of %d bytes; the registry or the network is stuck, try again", ErrUnreachable, what, d.Digest, c.stall, n, d.Size)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: fetch blob %s: %w", what, d.Digest, ctx.Err())
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%s: fetch blob %s (%d bytes): the blob cache %s is full; free space there or set XDG_CACHE_HOME to a bigger disk: %w", what, d.Digest, d.Size, c.dir, err)
	case err != nil && !strings.Contains(err.Error(), "error verifying"):
		// (go-containerregistry's remote reader reports a bad digest or size
		// itself, at the end of the blob; those fall through to our check.)
		return fmt.Errorf("%s: fetch blob %s: %w", what, d.Digest, err)
	case n != d.Size || got != d.Digest:
		return fmt.Errorf("%w: %s: blob %s: expected %s (%d bytes), got %s (%d bytes); the source is damaged or changed after locking — copy it again, or run `kiln lock` if the change is intended; nothing was cached",
			ErrCorrupt, what, d.Digest, d.Digest, d.Size, got, n)
	}
	// Blobs are public content, and the image partition keeps the mode of
	// the cached file it links: the node's unprivileged registry must read it.
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), c.Path(d.Digest)); err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	return nil
}

// tempPrefix starts the names of blobs being written.
const tempPrefix = ".tmp-"

// stallTimeout is how long a blob's source may send nothing (a Cache's
// default; also how long a registry may take to answer a request).
const stallTimeout = 2 * time.Minute

var errStalled = errors.New("source stalled")

// ctxReader stops a copy once ctx is done, and pushes the stall watchdog
// back whenever data arrives.
type ctxReader struct {
	ctx      context.Context
	r        io.Reader
	watchdog *time.Timer
	stall    time.Duration
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := r.r.Read(p)
	if n > 0 {
		r.watchdog.Reset(r.stall)
	}
	return n, err
}

// readCached reads a small cached blob (a manifest) and checks its digest.
func (c *Cache) readCached(h v1.Hash, src source) ([]byte, bool, error) {
	f, err := os.Open(c.Path(h))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("blob cache: %w", err)
	}
	defer f.Close()
	raw, err := readSmall(f, src, h)
	if err != nil {
		return nil, false, err
	}
	if got, _, _ := v1.SHA256(bytes.NewReader(raw)); got != h {
		return nil, false, nil // damaged cache entry: fetch it again
	}
	return raw, true, nil
}
