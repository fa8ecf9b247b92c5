// Package output is how a factory command (kiln build, bundle,
// reflash-stick) writes its output file: refused before any work when it
// could not or must not be replaced (a directory, a device, one of the
// run's inputs), written to a temporary file beside it, synced and renamed
// over it only once complete. A run that fails, is interrupted or is killed
// leaves no half-written output, and whatever was there before stays as it
// was; what a killed run left, the next run sweeps.
package output

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/builder/internal/leftover"
	"github.com/kiln-appliance/kiln/recipes"
)

// tempInfix names an output's temporary file beside it:
// "." + its name + tempInfix + the run's tag (leftover.Pattern).
const tempInfix = ".kiln-tmp-"

// Input is a file a run reads, named for the message that refuses to
// write over it.
type Input struct {
	What string // "the recipe", "the base image (base.path)", …
	Path string
}

// RecipeInputs are the files a run over r reads: the recipe, its lock and
// every file the recipe names (recipes.Recipe.Files; its layout
// directories are no file an output could be).
func RecipeInputs(r *recipes.Recipe) []Input {
	inputs := []Input{{"the recipe", r.Path}, {"the recipe's lock file", recipes.LockPath(r.Path)}}
	for _, f := range r.Files() {
		if !f.Dir {
			inputs = append(inputs, Input{fmt.Sprintf("the %s the recipe names (%s)", f.What, f.Field), f.Path})
		}
	}
	return inputs
}

// Check refuses, before any work, an output path the final rename would
// fail on or should never replace: none, a directory, a device (a USB
// stick given as -o would have its device node replaced by a regular
// file), anything but a regular file, or one of the run's inputs. example
// is a file name to suggest ("appliance.raw").
func Check(path, example string, inputs []Input) error {
	if path == "" {
		return fmt.Errorf("no output file given (-o FILE)")
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("output %s: %w", path, err)
	case fi.IsDir():
		return fmt.Errorf("output %s is a directory: give the file to write, e.g. -o %s", path, filepath.Join(path, example))
	case fi.Mode()&fs.ModeDevice != 0:
		return fmt.Errorf("output %s is a device, not a regular file: kiln writes an image file; write to a file (-o %s), "+
			"then write that file to the stick or disk with kiln write, a USB image writer or dd (see docs/technician.md)", path, example)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("output %s is not a regular file (%s): give a file to write", path, fi.Mode().Type())
	}
	return checkNotInput(path, inputs)
}

// checkNotInput refuses an output that is one of the run's inputs: the
// finished output would be renamed over it. Files are compared by identity
// (os.SameFile: a symlink or another hard link to an input is that input);
// an output or input that does not exist yet (a lock the build is about to
// write) is compared by path.
func checkNotInput(out string, inputs []Input) error {
	outInfo, outErr := os.Stat(out)
	for _, in := range inputs {
		inInfo, inErr := os.Stat(in.Path)
		same := false
		if outErr == nil && inErr == nil {
			same = os.SameFile(outInfo, inInfo)
		} else {
			same = samePath(out, in.Path)
		}
		if same {
			return fmt.Errorf("output %s is %s, %s: writing there would destroy it; give -o another file", out, in.What, in.Path)
		}
	}
	return nil
}

// samePath compares two paths that may not exist by their absolute form,
// with the symlinks of their directories resolved.
func samePath(a, b string) bool {
	resolve := func(p string) string {
		abs, err := filepath.Abs(p)
		if err != nil {
			return p
		}
		if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
			return filepath.Join(dir, filepath.Base(abs))
		}
		return abs
	}
	return resolve(a) == resolve(b)
}

// File is an output being written: a temporary file beside its path.
type File struct {
	*os.File
	path string
}

// Create creates the temporary file an output is written to, beside path,
// so the final rename is atomic; its name carries this process's tag, so
// Sweep can remove it if the process is killed.
func Create(path string) (*File, error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, leftover.Pattern("."+filepath.Base(path)+tempInfix))
	if err != nil {
		return nil, fmt.Errorf("cannot write the output in %s: %w (choose a writable directory with -o)", dir, err)
	}
	return &File{File: f, path: path}, nil
}

// Commit makes the finished file the output: sync, close, rename over the
// output, sync the directory. It writes nothing when ctx is done (an
// interrupt after the last step looked keeps the previous output); after
// an error the temporary file is still the caller's to Discard.
func (f *File) Commit(ctx context.Context) error {
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), f.path); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	f.File = nil
	syncDir(filepath.Dir(f.path))
	return nil
}

// Discard removes the temporary file, unless Commit renamed it. It may be
// deferred on a nil File.
func (f *File) Discard() {
	if f == nil || f.File == nil {
		return
	}
	f.Close()
	os.Remove(f.Name())
	f.File = nil
}

// syncDir makes a rename in dir durable; best effort, the file is in
// place.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// Work is a directory where a run keeps what it writes besides the output,
// named by a prefix and the run's tag.
type Work struct{ Dir, Prefix string }

// MkdirWork creates a work directory whose name carries this process's
// tag (see Create).
func MkdirWork(w Work) (string, error) {
	return os.MkdirTemp(w.Dir, leftover.Pattern(w.Prefix))
}

// Sweep removes what killed runs left: temporary outputs beside path and
// the work directories named, whose owner is provably dead. It reports each
// removal, and each failure as a warning, to log; run names the kind of run
// ("build") in those lines.
func Sweep(path, run string, log io.Writer, work ...Work) {
	for _, w := range append([]Work{{filepath.Dir(path), "." + filepath.Base(path) + tempInfix}}, work...) {
		removed, err := leftover.Sweep(w.Dir, w.Prefix)
		for _, p := range removed {
			fmt.Fprintf(log, "removed %s, left by a %s that was killed\n", p, run)
		}
		if err != nil {
			fmt.Fprintf(log, "warning: %v\n", err)
		}
	}
}
