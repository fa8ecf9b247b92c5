// Package atomicfile replaces a file so that readers see the old content or
// the new, never a partial file, even across a crash: write a temp file on
// the same filesystem, fsync it, rename it over the target, fsync the
// directories.
//
// A writer killed between write and rename leaves its temp file behind. So
// that such a file is never read as configuration (CRI-O parses every file
// in crio.conf.d), WithTempDir puts temp files outside the directory a
// program reads; and every write removes the temp files of earlier writes
// of the same target, which are provably abandoned: each writer holds an
// exclusive flock(2) on the temp directory from before it creates its temp
// file until after it is renamed or removed, and the kernel drops the lock
// of a killed process.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

type options struct {
	tempDir      string
	beforeRename func(tmp string)
}

// Option configures WriteFile.
type Option func(*options)

// WithTempDir writes the temp file in dir, which must be on the target's
// filesystem (rename cannot cross filesystems): a directory the target's
// readers do not scan, e.g. /etc/crio for /etc/crio/crio.conf.d/*.conf.
func WithTempDir(dir string) Option { return func(o *options) { o.tempDir = dir } }

// BeforeRename calls f with the temp file's path once it is written and
// synced, just before the rename: the step fault tests kill a writer at.
func BeforeRename(f func(tmp string)) Option { return func(o *options) { o.beforeRename = f } }

// WriteFile atomically replaces path with data, creating parent directories
// (0755) as needed.
func WriteFile(path string, data []byte, mode os.FileMode, opts ...Option) error {
	return Write(path, mode, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}, opts...)
}

// Write atomically replaces path with what fill writes, streamed to the temp
// file; when fill fails (say, a digest does not match) the temp file is
// removed and path is left as it was.
func Write(path string, mode os.FileMode, fill func(w io.Writer) error, opts ...Option) (err error) {
	dir := filepath.Dir(path)
	o := options{tempDir: dir}
	for _, opt := range opts {
		opt(&o)
	}
	for _, d := range []string{dir, o.tempDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	unlock, err := LockDir(o.tempDir)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer unlock()
	pattern := "." + filepath.Base(path) + ".tmp-"
	if err := removeAbandoned(o.tempDir, dir, pattern); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(o.tempDir, pattern+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if o.beforeRename != nil {
		o.beforeRename(tmp.Name())
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		if errors.Is(err, syscall.EXDEV) {
			err = fmt.Errorf("%w (the temp directory %s must be on the same filesystem)", err, o.tempDir)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	if o.tempDir != dir {
		if err := SyncDir(o.tempDir); err != nil {
			return err
		}
	}
	return SyncDir(dir)
}

// LockDir takes an exclusive flock on dir, waiting for the writer that
// holds it, and returns the function that releases it (the kernel drops
// it if the process dies).
func LockDir(dir string) (func(), error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	for {
		err = syscall.Flock(int(d.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { d.Close() }, nil
}

// removeAbandoned removes temp files named pattern* in the temp directory
// and in the target's directory (where writers without WithTempDir, and
// kiln versions before it, put them). Called with the lock held, so no
// live writer owns one.
func removeAbandoned(tempDir, dir, pattern string) error {
	dirs := []string{tempDir}
	if dir != tempDir {
		dirs = append(dirs, dir)
	}
	for _, d := range dirs {
		stale, err := filepath.Glob(filepath.Join(d, pattern+"*"))
		if err != nil {
			return err
		}
		for _, p := range stale {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("remove an abandoned temp file: %w", err)
			}
		}
	}
	return nil
}

// Remove deletes path (a missing file is fine) and makes the removal durable.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// SyncDir makes the entries of dir (creations, renames, removals) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
