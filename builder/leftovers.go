package builder

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/builder/internal/leftover"
	"github.com/kiln-appliance/kiln/builder/preload"
)

// Prefixes of what a build writes while it runs; leftover.Pattern adds the
// owner's tag, so a later build can tell a killed build's leftovers apart.
const (
	outputTempInfix = ".kiln-tmp-" // "."+output name+outputTempInfix, beside the output
	workDirPrefix   = "build-"     // the staging tree, in the cache directory
)

// sweepLeftovers removes what builds killed before their cleanup ran
// (SIGKILL, a power cut) left behind: a temporary disk beside this output,
// staging trees in the cache directory, preload run roots in $TMPDIR. Only
// entries whose owner is provably dead go; a failure to remove one is
// reported and does not stop the build.
func (b *build) sweepLeftovers(context.Context) error {
	for _, where := range []struct{ dir, prefix string }{
		{filepath.Dir(b.o.Output), "." + filepath.Base(b.o.Output) + outputTempInfix},
		{b.o.CacheDir, workDirPrefix},
		{os.TempDir(), preload.RunRootPrefix},
	} {
		removed, err := leftover.Sweep(where.dir, where.prefix)
		for _, p := range removed {
			fmt.Fprintf(b.o.Log, "removed %s, left by a build that was killed\n", p)
		}
		if err != nil {
			fmt.Fprintf(b.o.Log, "warning: %v\n", err)
		}
	}
	return nil
}
