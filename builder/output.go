package builder

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/recipes"
)

// checkOutput refuses, before any work, an output the final rename would
// fail on or should never replace: a directory, or a device (a USB stick
// given as -o would have its device node replaced by a regular file).
func checkOutput(path string) error {
	if path == "" {
		return fmt.Errorf("no output file given (-o DISK)")
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("output %s: %w", path, err)
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		return fmt.Errorf("output %s is a directory: give the disk image file to write, e.g. -o %s/appliance.raw", path, path)
	case m&fs.ModeDevice != 0:
		return fmt.Errorf("output %s is a device: kiln build writes a disk image file; build to a file (-o appliance.raw), "+
			"then write that file to the stick or disk with kiln write, a USB image writer or dd (see docs/technician.md)", path)
	case !m.IsRegular():
		return fmt.Errorf("output %s is not a regular file (%s): give a disk image file to write", path, m.Type())
	}
	return nil
}

// Input is a file a run reads, named for the message that refuses to
// write over it.
type Input struct {
	What string // "the recipe", "the base image (base.path)", …
	Path string
}

// RecipeInputs are the files a build of r reads: the recipe, its lock and
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

// CheckNotInput refuses, before any work, an output that is one of the
// run's inputs: the finished output would be renamed over it. Files are
// compared by identity (os.SameFile: a symlink or another hard link to an
// input is that input); an output or input that does not exist yet (a
// lock the build is about to write) is compared by path.
func CheckNotInput(out string, inputs []Input) error {
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
