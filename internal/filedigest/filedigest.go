// Package filedigest is the sha256 of a whole file, streamed: one rule for
// the factory (a staged file, a stick's agent) and the node (a boot file on
// the ESP, a stored blob).
package filedigest

import (
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/opencontainers/go-digest"
)

// Of returns the sha256 digest of the file at path ("sha256:<hex>", as
// kiln's records hold it) and its size.
func Of(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	return of(f, path)
}

// OfFS is Of for the file name in fsys.
func OfFS(fsys fs.FS, name string) (string, int64, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	return of(f, name)
}

func of(r io.Reader, name string) (string, int64, error) {
	d := digest.SHA256.Digester()
	n, err := io.Copy(d.Hash(), r)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", name, err)
	}
	return d.Digest().String(), n, nil
}
