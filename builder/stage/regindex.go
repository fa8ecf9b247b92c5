package stage

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// WriteRegistryIndex indexes the OCI layout dir by the rules the node's
// registry serves it by (regindex.Build) and writes the result into dir as
// regindex.FileName, so `kiln serve` starts by reading that one file
// instead of every manifest. Call it once the layout is complete.
// The file appears whole or not at all (temp file + rename).
func WriteRegistryIndex(dir string) error {
	// The indexing's warnings (an unnamed image, a bare tag) concern the
	// layout, which the builder wrote from a checked recipe: not repeated.
	ix, err := regindex.Build(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return fmt.Errorf("index the staged layout for the node's registry: %w", err)
	}
	b, err := regindex.Encode(ix)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, regindex.FileName)
	tmp, err := os.CreateTemp(dir, ".registry-index-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", dst, err)
	}
	return nil
}
