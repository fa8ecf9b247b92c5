// Package layerscan checks a container image layer before it is unpacked:
// the blob's digest and size, and that no tar entry could land outside the
// layer root. It reads the blob once, streaming.
package layerscan

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	digest "github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/pkg/compression"
)

// Blob checks the layer blob at p: its content must hash to d and be size
// bytes long (size < 0: not checked), and its tar entries must pass Tar. A
// corrupt blob is reported as such even when its tar is also broken.
func Blob(p string, d digest.Digest, size int64) error {
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("blob %s is missing from the OCI layout; stage the image again", p)
	} else if err != nil {
		return err
	}
	defer f.Close()
	hash := d.Algorithm().Hash()
	var n countWriter
	raw := io.TeeReader(f, io.MultiWriter(hash, &n))

	scanErr := Tar(raw)
	// Hash the whole blob even if the tar ended early or was unreadable:
	// a corrupt blob explains a broken tar better than the tar error does.
	if _, err := io.Copy(io.Discard, raw); err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if got := digest.NewDigest(d.Algorithm(), hash); got != d {
		return fmt.Errorf("blob %s is corrupt: its content hashes to %s; fetch the image again", p, got)
	}
	if size >= 0 && int64(n) != size {
		return fmt.Errorf("blob %s is %d bytes, the manifest says %d; fetch the image again", p, n, size)
	}
	return scanErr
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// Tar checks every entry of a (possibly compressed) layer tar: none may be
// absolute, climb out with "..", be written through a symlink the same layer
// created, or hard-link to anything but an earlier entry of the layer.
func Tar(r io.Reader) error {
	dr, _, err := compression.AutoDecompress(r)
	if err != nil {
		return fmt.Errorf("not a layer: %w", err)
	}
	defer dr.Close()
	tr := tar.NewReader(dr)
	symlinks := map[string]bool{} // symlinks this layer created, by cleaned path
	files := map[string]bool{}    // everything else it created: hard-link targets
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("not a valid layer tar: %w", err)
		}
		name, err := inside(h.Name)
		if err != nil {
			return fmt.Errorf("tar entry %q %v; the image is malformed or hostile: rebuild it or remove it from the recipe", h.Name, err)
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if symlinks[d] {
				return fmt.Errorf("tar entry %q is written through the symlink %q the same layer created; the image is malformed or hostile: rebuild it or remove it from the recipe", h.Name, d)
			}
		}
		switch h.Typeflag {
		case tar.TypeLink:
			target, err := inside(h.Linkname)
			if err != nil {
				return fmt.Errorf("hard link %q to %q: the target %v; the image is malformed or hostile: rebuild it or remove it from the recipe", h.Name, h.Linkname, err)
			}
			// Each layer unpacks into its own directory: a link can only
			// reach what this layer wrote before it.
			if !files[target] && !symlinks[target] {
				return fmt.Errorf("hard link %q to %q: the target is not earlier in the same layer; the image is malformed: rebuild it or remove it from the recipe", h.Name, h.Linkname)
			}
			delete(symlinks, name)
			files[name] = true
		case tar.TypeSymlink:
			symlinks[name] = true // its target is resolved on the node, in the container's root
			delete(files, name)
		default:
			delete(symlinks, name)
			files[name] = true
		}
	}
}

// inside cleans a tar path and refuses one that is absolute or climbs out
// of the layer root.
func inside(name string) (string, error) {
	if path.IsAbs(name) {
		return "", errors.New("is an absolute path")
	}
	c := path.Clean(name)
	if c == ".." || len(c) > 2 && c[:3] == "../" {
		return "", errors.New("leaves the layer root")
	}
	return c, nil
}
