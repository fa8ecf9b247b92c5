package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// releaseSource is the node's release state as a source of images: the
// releases it keeps that the node runs or may roll back to, each image by
// its name and digest, blobs from the release store (only those a release
// lists) and then the partition's layouts.
type releaseSource struct {
	stateFile string // contract.StateFile on a node
	store     string // contract.ReleaseStore on a node
}

// role names r's place in s, for log lines.
func role(s *state.State, r contract.Release) string {
	switch {
	case s.Trying != nil && s.Trying.Version == r.Version:
		return "trying"
	case s.Current.Version == r.Version:
		return "current"
	}
	return "previous"
}

// storeBlobDir returns the release store's blobs/sha256 directory, "" when
// the store has none yet. A symlink on the way is refused: a blob could
// then live anywhere.
func storeBlobDir(store string) (string, error) {
	dir := store
	for _, sub := range []string{ocispec.ImageBlobsDir, "sha256"} {
		dir = filepath.Join(dir, sub)
		fi, err := os.Lstat(dir)
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("release store: %w", err)
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("release store: %s is not a directory (%s): the registry serves only files inside the store; "+
				"remove it, roll the release back (kiln agent release rollback VERSION) and plug its stick in again", dir, fi.Mode().Type())
		}
	}
	return dir, nil
}

// loadReleases adds the served releases of the state to the index. Their
// manifests are read and verified (they are small); blobs are only
// stat'ed. An image whose manifest is nowhere or damaged is skipped with
// an error line, the rest are served.
func (l *loader) loadReleases(rs *releaseSource, roots []string) error {
	s, err := state.Read(rs.stateFile)
	if errors.Is(err, os.ErrNotExist) {
		l.log.Info("no release state: serving the image partition only", "state", rs.stateFile)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w (check it with `kiln agent status`)", rs.stateFile, err)
	}
	store, err := storeBlobDir(rs.store)
	if err != nil {
		return err
	}
	releases := s.Served()
	src := regindex.Source{Store: store, Stored: map[string]bool{}}
	for _, r := range releases {
		for _, b := range r.Blobs {
			src.Stored[b] = true
		}
	}
	for _, root := range roots {
		src.Dirs = append(src.Dirs, filepath.Join(root, ocispec.ImageBlobsDir, "sha256"))
	}
	for _, r := range releases {
		for _, im := range r.Images {
			if im.Served {
				l.loadReleaseImage(src, im, fmt.Sprintf("release %s (%s) image %s", r.Version, role(s, r), im.Name))
			}
		}
	}
	return nil
}

// loadReleaseImage serves one image of a release under its name: by digest
// always, and by the tag its name carries.
func (l *loader) loadReleaseImage(src regindex.Source, im contract.Image, where string) {
	ref, err := contract.ParseReference(im.Name)
	if err == nil {
		err = regindex.ValidName(ref.Repository())
	}
	switch {
	case err != nil:
		l.log.Error("release image not served: its name is not an image reference", "entry", where, "error", err)
		return
	case !regindex.ValidDigest(im.Digest):
		l.log.Error("release image not served: its digest is not sha256:<64 hex>", "entry", where, "digest", im.Digest)
		return
	case ref.Digest != "" && ref.Digest != im.Digest:
		l.log.Error("release image not served: its name's digest differs from its digest", "entry", where, "digest", im.Digest)
		return
	}
	d := ocispec.Descriptor{MediaType: im.MediaType, Digest: digest.Digest(im.Digest), Size: -1}
	if err := l.walk.Manifest(src, d, where); err != nil {
		l.ix.damaged++
		l.log.Error("release image not served: roll the release back (kiln agent release rollback VERSION) and plug its stick in again", "error", err)
		return
	}
	tag := ref.Tag
	if ref.Digest != "" || (tag != "" && !regindex.ValidTag(tag)) {
		tag = "" // a tag beside a digest is decoration, as in ParseName
	}
	l.addToRepo(ref.Repository(), tag, im.Digest, where)
}
