package builder

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
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
