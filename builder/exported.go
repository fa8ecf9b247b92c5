package builder

import (
	"fmt"
	"os"
	"path/filepath"
)

// The pieces of the build other outputs of the pipeline share (upgrade
// bundles, builder/bundle).

// AgentBinary finds the kiln binary the node will run (path, or this
// executable when empty) and checks it is a Linux executable for arch.
func AgentBinary(path, arch string) (string, error) { return agentBinary(path, arch) }

// SourceDateEpoch picks the timestamp of everything written: v, then
// $SOURCE_DATE_EPOCH, then DefaultSourceDateEpoch.
func SourceDateEpoch(v int64) (int64, error) { return sourceDateEpoch(v) }

// CreateTemp creates the temporary file an output is written to, beside it,
// so the final rename is atomic.
func CreateTemp(out string) (*os.File, error) {
	dir := filepath.Dir(out)
	f, err := os.CreateTemp(dir, "."+filepath.Base(out)+".kiln-tmp-")
	if err != nil {
		return nil, fmt.Errorf("cannot write the output in %s: %w (choose a writable directory with -o)", dir, err)
	}
	return f, nil
}

// SyncDir makes a rename in dir durable.
func SyncDir(dir string) { syncDir(dir) }
