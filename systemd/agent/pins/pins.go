// Package pins writes CRI-O's image pins on the node (contract.PinsDropIn,
// rendered by contract.RenderPins) so that CRI-O never reads half a list.
package pins

import (
	"path/filepath"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Write renders the pins for images and atomically replaces path with them
// (temp file, fsync, rename, fsync directory): CRI-O never reads half a list.
// The temp file is written in the directory above path's (/etc/crio for
// /etc/crio/crio.conf.d/…): CRI-O parses every file in crio.conf.d, so a
// writer killed before its rename must not leave its temp file there. The
// next write removes such a file (see atomicfile).
func Write(path string, images []contract.Image) error {
	return write(path, images)
}

func write(path string, images []contract.Image, opts ...atomicfile.Option) error {
	data, err := contract.RenderPins(images)
	if err != nil {
		return err
	}
	opts = append(opts, atomicfile.WithTempDir(filepath.Dir(filepath.Dir(path))))
	return atomicfile.WriteFile(path, data, 0o644, opts...)
}
