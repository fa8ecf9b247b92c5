package builder

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/builder/internal/leftover"
)

// The pieces of the build other outputs of the pipeline share (upgrade
// bundles, builder/bundle).

// SourceDateEpoch picks the timestamp of everything written: v, then
// $SOURCE_DATE_EPOCH, then DefaultSourceDateEpoch.
func SourceDateEpoch(v int64) (int64, error) { return sourceDateEpoch(v) }

// CreateTemp creates the temporary file an output is written to, beside it,
// so the final rename is atomic; its name carries this process's tag, so
// SweepLeftovers can remove it if the process is killed.
func CreateTemp(out string) (*os.File, error) {
	dir := filepath.Dir(out)
	f, err := os.CreateTemp(dir, leftover.Pattern("."+filepath.Base(out)+outputTempInfix))
	if err != nil {
		return nil, fmt.Errorf("cannot write the output in %s: %w (choose a writable directory with -o)", dir, err)
	}
	return f, nil
}

// MkdirWork creates a work directory in dir whose name starts with prefix
// and carries this process's tag (see CreateTemp).
func MkdirWork(dir, prefix string) (string, error) {
	return os.MkdirTemp(dir, leftover.Pattern(prefix))
}

// SweepLeftovers removes what killed runs left: temporary outputs beside out
// and work directories named prefix in workDir, whose owner is provably
// dead. It reports each removal, and each failure as a warning, to log.
func SweepLeftovers(out, workDir, prefix string, log io.Writer) {
	for _, where := range []struct{ dir, prefix string }{
		{filepath.Dir(out), "." + filepath.Base(out) + outputTempInfix},
		{workDir, prefix},
	} {
		removed, err := leftover.Sweep(where.dir, where.prefix)
		for _, p := range removed {
			fmt.Fprintf(log, "removed %s, left by a run that was killed\n", p)
		}
		if err != nil {
			fmt.Fprintf(log, "warning: %v\n", err)
		}
	}
}

// SyncDir makes a rename in dir durable.
func SyncDir(dir string) { syncDir(dir) }

// CheckOutput refuses an output path that is a directory, a device or not
// a regular file, before any work.
func CheckOutput(path string) error { return checkOutput(path) }
