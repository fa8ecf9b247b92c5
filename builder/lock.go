// Package builder is kiln's factory pipeline: resolve the recipe's images to
// digests (the lock), fetch and verify them into the blob cache, stage the
// image partition, and assemble the disk image.
package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/internal/leftover"
	"github.com/kiln-appliance/kiln/recipes"
)

// platform is the recipe's platform in go-containerregistry's terms.
func platform(r *recipes.Recipe) v1.Platform {
	return v1.Platform{OS: "linux", Architecture: r.Arch}
}

// LockedImages are the lock's entries for r's images, in the recipe's
// order (the order of everything a run derives from them).
func LockedImages(r *recipes.Recipe, lock *recipes.Lock) ([]recipes.LockedImage, error) {
	var locked []recipes.LockedImage
	for _, img := range r.Images {
		li, ok := lock.Image(img.Name)
		if !ok { // lock.Check already refused this; keep the error precise anyway
			return nil, fmt.Errorf("image %s is not in the lock file: run `kiln lock %s`", img.Name, r.Path)
		}
		locked = append(locked, li)
	}
	return locked, nil
}

// FetchRequest is what fetching the image li of r's lock asks the cache
// for: its locked source, digests and platform (the build's, a bundle's and
// a --from lock's fetch alike; the build adds InPlace).
func FetchRequest(r *recipes.Recipe, li recipes.LockedImage) fetch.Request {
	return fetch.Request{Name: li.Name, Source: li.Source, BaseDir: r.Dir, Digest: li.Digest, IndexDigest: li.IndexDigest, Platform: platform(r)}
}

// Resolve resolves every image of the recipe to a digest for its platform.
func Resolve(ctx context.Context, r *recipes.Recipe, log io.Writer, opts ...fetch.Option) (*recipes.Lock, error) {
	var images []recipes.LockedImage
	for _, img := range r.Images {
		src := img.EffectiveSource()
		res, err := fetch.Resolve(ctx, src, r.Dir, platform(r), opts...)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", img.Name, err)
		}
		// A name pinned by digest must resolve to that digest, whatever the source.
		if ref, err := name.NewDigest(img.Name); err == nil && ref.DigestStr() != res.Digest && ref.DigestStr() != res.IndexDigest {
			return nil, fmt.Errorf("resolve %s: source %s has digest %s, but the name pins %s; fix the name or the source", img.Name, src, res.Digest, ref.DigestStr())
		}
		fmt.Fprintf(log, "locked %s -> %s\n", img.Name, res.Digest)
		images = append(images, recipes.LockedImage{
			Name:        img.Name,
			Source:      src,
			Digest:      res.Digest,
			IndexDigest: res.IndexDigest,
			MediaType:   res.MediaType,
			Size:        res.Size,
		})
	}
	return recipes.NewLock(r, images), nil
}

// LockOptions say how the build gets its lock.
type LockOptions struct {
	Refresh bool // re-resolve even when the lock is fresh, and replace it
	Fetch   []fetch.Option
	// Check, when set, is asked about the lock before it is used, or
	// written when new: a lock it refuses is not written.
	Check func(*recipes.Lock) error
}

// EnsureLock returns the recipe's lock: the lock file when it is fresh; a new
// one (written beside the recipe) when there is none or Refresh is set. A
// stale lock is an error unless Refresh is set, so a build never silently
// ships other images than the ones the lock names.
func EnsureLock(ctx context.Context, r *recipes.Recipe, o LockOptions, log io.Writer) (*recipes.Lock, error) {
	path := recipes.LockPath(r.Path)
	lock, err := recipes.ReadLock(path)
	switch {
	case err == nil && !o.Refresh:
		if err := lock.Check(r); err != nil {
			return nil, fmt.Errorf("%w (or build with --refresh-lock)", err)
		}
		if err := o.check(lock); err != nil {
			return nil, err
		}
		return lock, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, err
	case err != nil:
		fmt.Fprintf(log, "no lock file %s: resolving the recipe's images\n", path)
	}
	lock, err = Resolve(ctx, r, log, o.Fetch...)
	if err != nil {
		return nil, err
	}
	if err := o.check(lock); err != nil {
		return nil, err
	}
	if err := WriteLock(lock, path, log); err != nil {
		return nil, err
	}
	lock.Path = path
	fmt.Fprintf(log, "wrote %s (%d images)\n", path, len(lock.Images))
	return lock, nil
}

// WriteLock writes the lock to path atomically: a temporary file beside
// it, synced, then renamed over path. On any failure path is left as it
// was and the temporary file is removed. The temporary file's name carries
// this process's tag (leftover.Pattern): one a killed kiln left is removed
// here, by the next run that writes this lock, once its owner is provably
// gone, and reported to log.
func WriteLock(l *recipes.Lock, path string, log io.Writer) error {
	data, err := l.Encode()
	if err != nil {
		return err
	}
	dir, prefix := filepath.Dir(path), "."+filepath.Base(path)+".tmp-"
	removed, err := leftover.Sweep(dir, prefix)
	for _, p := range removed {
		fmt.Fprintf(log, "removed %s, left by a kiln that was killed\n", p)
	}
	if err != nil {
		fmt.Fprintf(log, "warning: %v\n", err)
	}
	f, err := os.CreateTemp(dir, leftover.Pattern(prefix))
	if err != nil {
		return fmt.Errorf("write lock file: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if tmp != "" {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write lock file %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write lock file %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write lock file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write lock file %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write lock file %s: %w", path, err)
	}
	tmp = ""
	syncDir(dir) // persist the rename; best effort, the file is in place
	return nil
}

func (o LockOptions) check(l *recipes.Lock) error {
	if o.Check == nil {
		return nil
	}
	return o.Check(l)
}

// LockError places a fetch's error that blames the lock (a digest or index
// digest the source contradicts) at the lock entry's line; other errors
// are returned as they are.
func LockError(lock *recipes.Lock, err error) error {
	var re *fetch.RequestError
	if !errors.As(err, &re) || !errors.Is(err, fetch.ErrLockMismatch) {
		return err
	}
	field := "digest"
	if errors.Is(err, fetch.ErrLockedIndex) {
		field = "indexDigest"
	}
	return lock.Errorf(re.Name, field, "%v", re.Err)
}

// checkLockedSize refuses a lock whose size for an image (li) is not the
// size of what was fetched for it (manifest, config and layers, as Resolve
// adds them): the lock's size goes into kiln.json, so a lock edited by one
// byte would put a wrong size on the disk (and in kiln inspect).
func checkLockedSize(lock *recipes.Lock, li recipes.LockedImage, img *fetch.Image) error {
	size := int64(len(img.Manifest))
	for _, d := range img.Blobs() {
		size += d.Size
	}
	if li.Size != size {
		return lock.Errorf(li.Name, "size", "%d, but image %s is %d bytes (its manifest, config and layers as fetched): "+
			"the lock was edited or damaged; run `kiln lock` (or build with --refresh-lock) to rewrite it", li.Size, li.Name, size)
	}
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
