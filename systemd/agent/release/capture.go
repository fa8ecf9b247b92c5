package release

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// captureFiles records the files the node has under contract.ReleaseDirs as
// r's, copying their contents into the release store: on a factory node they
// are the factory release's (Ignition wrote them), and a rollback to it must
// be able to put them back after a later release replaced or removed them.
// Hidden files (temp files, editor leftovers) are not a release's.
func (m *Machine) captureFiles(r *contract.Release) error {
	for _, dir := range contract.ReleaseDirs {
		err := filepath.WalkDir(m.path(dir), func(p string, d fs.DirEntry, err error) error {
			if os.IsNotExist(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			rel, err := filepath.Rel(m.path("/"), p)
			if err != nil {
				return err
			}
			m.step("capture /" + filepath.ToSlash(rel))
			f, err := m.captureFile(p, "/"+filepath.ToSlash(rel))
			if err != nil {
				return err
			}
			r.Files = append(r.Files, f)
			if !slices.Contains(r.Blobs, f.Digest) {
				r.Blobs = append(r.Blobs, f.Digest)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("record the factory release's files under %s: %w", dir, err)
		}
	}
	slices.Sort(r.Blobs)
	return nil
}

// captureFile copies the node's file at p into the store and describes it.
func (m *Machine) captureFile(p, nodePath string) (contract.ReleaseFile, error) {
	f, err := os.Open(p)
	if err != nil {
		return contract.ReleaseFile{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return contract.ReleaseFile{}, err
	}
	dg := digest.Canonical.Digester()
	if _, err := io.Copy(dg.Hash(), f); err != nil {
		return contract.ReleaseFile{}, fmt.Errorf("read %s: %w", p, err)
	}
	rf := contract.ReleaseFile{Path: nodePath, Mode: uint32(fi.Mode().Perm()), Size: fi.Size(), Digest: dg.Digest().String()}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return rf, err
	}
	err = atomicfile.Write(m.storeBlob(rf.Digest), 0o644, func(w io.Writer) error {
		v := dg.Digest().Verifier()
		if _, err := io.Copy(io.MultiWriter(w, v), f); err != nil {
			return err
		}
		if !v.Verified() {
			return fmt.Errorf("%s changed while it was being recorded", p)
		}
		return nil
	})
	return rf, err
}
