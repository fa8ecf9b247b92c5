// Package restore keeps the promise that a kept release's images are on the
// node, offline, whatever the container runtime did to its own store: at
// every boot, after CRI-O has started (CRI-O checks its store after an
// unclean shutdown and may wipe it; it also wipes its images after its own
// version changed) and before the workloads start, it finds every image the
// node must hold in local storage by digest and puts back what is missing
// from kiln's own copies: the image partition (dm-verity) and the release
// store, every blob checked against its digest as it is read. Nothing comes
// from a network. See docs/upgrade.md, "Images that survive a power cut".
package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/localimage"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Needed returns the images the node must hold in local storage at this
// boot, each once (by digest), in the state's order:
//   - every image of the releases it may run without another upgrade boot:
//     the current one, the previous one (a rollback target) and the one
//     being tried;
//   - the preloaded images of a staged release (its import put them in
//     local storage; the rest comes at its upgrade boot);
//
// except, when this boot's registry serves them (registryRuns: the first
// boot, an upgrade boot, alwaysOn), the served-only images of the releases
// it serves: pulls through the mirror bring them, and the first boot's or
// the upgrade's wait makes sure they do.
func Needed(s *state.State, registryRuns bool) []contract.Image {
	var out []contract.Image
	seen := map[string]bool{}
	add := func(im contract.Image) {
		if !seen[im.Digest] {
			seen[im.Digest] = true
			out = append(out, im)
		}
	}
	runnable := []contract.Release{s.Current}
	for _, r := range []*contract.Release{s.Trying, s.Previous} {
		if r != nil {
			runnable = append(runnable, *r)
		}
	}
	for _, r := range runnable {
		for _, im := range r.Images {
			if registryRuns && im.Served && !im.Preloaded {
				continue
			}
			add(im)
		}
	}
	if s.Staged != nil {
		for _, im := range s.Staged.Images {
			if im.Preloaded {
				add(im)
			}
		}
	}
	return out
}

// Sources are kiln's own copies of images, tried in order for each image.
type Sources struct {
	// BlobDirs hold the image blobs, each laid out as an OCI layout's blobs/
	// (<dir>/sha256/<hex>): the release store's, then the image partition's.
	BlobDirs []string
	// CopyPreloaded copies the images with the given IDs from the image
	// partition's preloaded store into the main store (preload mode copy:
	// an image preloaded but not served has no blobs to load from); nil
	// when the partition has no preloaded store or the mode is "store"
	// (the store is then an additional image store, never lost).
	CopyPreloaded func(ctx context.Context, ids []string) error
}

// Report is what a run found and did.
type Report struct {
	Needed   int            // images the node must hold
	Restored []Restored     // put back, in order
	Missing  []MissingImage // still missing at the end (each with why)
}

// Restored is one image put back, and where from.
type Restored struct {
	Image contract.Image
	From  string
}

// MissingImage is an image that could not be put back.
type MissingImage struct {
	Image contract.Image
	Err   error
}

// ErrMissing is wrapped by Run's error when an image the node must hold is
// not in local storage and kiln holds no good copy of it.
var ErrMissing = errors.New("images the node must hold are missing from local storage")

// Run puts back every image of images that open's store lacks. The store is
// opened, used and shut down once per phase (the preloaded copy opens the
// main store itself; containers/storage shares one store object per process).
func Run(ctx context.Context, open func() (storage.Store, error), images []contract.Image, src Sources, log io.Writer) (Report, error) {
	rep := Report{Needed: len(images)}
	blobs := localimage.BlobDirs(src.BlobDirs)
	missing, err := missingIn(open, images)
	if err != nil {
		return rep, err
	}
	if len(missing) == 0 {
		fmt.Fprintf(log, "kiln: all %d image(s) the node keeps are in local storage\n", len(images))
		return rep, nil
	}
	fmt.Fprintf(log, "kiln: %d of %d image(s) the node keeps are not in local storage (the container runtime lost them: an unclean shutdown or its own upgrade wipes its store); restoring them from kiln's copies: %s\n",
		len(missing), len(images), names(missing))

	// Preloaded images that have no blobs: copied from the preloaded store.
	var fromBlobs, preloadedOnly []contract.Image
	for _, im := range missing {
		if _, err := blobs.Path(im.Digest); err != nil && im.Preloaded && src.CopyPreloaded != nil {
			preloadedOnly = append(preloadedOnly, im)
			continue
		}
		fromBlobs = append(fromBlobs, im)
	}
	if len(preloadedOnly) > 0 {
		var ids []string
		for _, im := range preloadedOnly {
			ids = append(ids, strings.TrimPrefix(im.ImageID, "sha256:"))
		}
		if err := src.CopyPreloaded(ctx, ids); err != nil {
			fmt.Fprintf(log, "kiln: copying from the image partition's preloaded store failed: %v\n", err)
		}
	}

	if len(fromBlobs) > 0 {
		store, err := open()
		if err != nil {
			return rep, err
		}
		for _, im := range fromBlobs {
			if err := ctx.Err(); err != nil {
				closeStore(store) //nolint:errcheck // the context's error says more
				return rep, err
			}
			from, err := load(store, im, blobs)
			if err != nil {
				fmt.Fprintf(log, "kiln: cannot restore %s@%s: %v\n", im.Name, im.Digest, err)
				continue
			}
			fmt.Fprintf(log, "kiln: restored %s@%s from %s\n", im.Name, im.Digest, from)
			rep.Restored = append(rep.Restored, Restored{Image: im, From: from})
		}
		if err := closeStore(store); err != nil {
			return rep, err
		}
	}

	// What counts is what the store holds now, however it got there.
	still, err := missingIn(open, missing)
	if err != nil {
		return rep, err
	}
	for _, im := range preloadedOnly {
		if !slices.ContainsFunc(still, func(s contract.Image) bool { return s.Digest == im.Digest }) {
			fmt.Fprintf(log, "kiln: restored %s@%s from the image partition's preloaded store\n", im.Name, im.Digest)
			rep.Restored = append(rep.Restored, Restored{Image: im, From: "the image partition's preloaded store"})
		}
	}
	for _, im := range still {
		rep.Missing = append(rep.Missing, MissingImage{Image: im, Err: whyMissing(im, src)})
	}
	if len(rep.Missing) > 0 {
		return rep, fmt.Errorf("%w: %s. kiln holds no good copy of them (%s); the workloads that use them cannot start offline: "+
			"plug in the upgrade stick of this release again (kiln agent import), or reflash the appliance",
			ErrMissing, names(still), whyAll(rep.Missing))
	}
	fmt.Fprintf(log, "kiln: restored %d image(s); all %d image(s) the node keeps are in local storage\n", len(rep.Restored), len(images))
	return rep, nil
}

// load puts im into the store from its blobs and says where they were.
func load(store storage.Store, im contract.Image, blobs localimage.BlobDirs) (string, error) {
	p, err := blobs.Path(im.Digest)
	if err != nil {
		return "", err
	}
	if err := localimage.Load(store, im, blobs); err != nil {
		return "", err
	}
	for _, dir := range blobs {
		if strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return dir, nil
		}
	}
	return filepath.Dir(p), nil
}

func missingIn(open func() (storage.Store, error), images []contract.Image) ([]contract.Image, error) {
	store, err := open()
	if err != nil {
		return nil, err
	}
	var missing []contract.Image
	for _, im := range images {
		ids, err := localimage.Find(store, im)
		if err != nil {
			closeStore(store) //nolint:errcheck // the lookup's error says more
			return nil, err
		}
		if len(ids) == 0 {
			missing = append(missing, im)
		}
	}
	if err := closeStore(store); err != nil {
		return nil, err
	}
	return missing, nil
}

// closeStore releases the store. The layers of running containers stay
// mounted (they are CRI-O's), which containers/storage reports as an
// error of its Shutdown: on a running node that is the normal case.
func closeStore(store storage.Store) error {
	if _, err := store.Shutdown(false); err != nil && !errors.Is(err, storage.ErrLayerUsedByContainer) {
		return fmt.Errorf("close containers/storage: %w", err)
	}
	return nil
}

func whyMissing(im contract.Image, src Sources) error {
	if _, err := localimage.BlobDirs(src.BlobDirs).Path(im.Digest); err != nil {
		if im.Preloaded && src.CopyPreloaded != nil {
			return errors.New("not in the preloaded store either")
		}
		return err
	}
	return errors.New("its blobs did not load (see above)")
}

func whyAll(ms []MissingImage) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.Image.Name+": "+m.Err.Error())
	}
	return strings.Join(s, "; ")
}

func names(images []contract.Image) string {
	var s []string
	for _, im := range images {
		s = append(s, im.Name+"@"+im.Digest)
	}
	return strings.Join(s, ", ")
}

// Presence is what local storage holds of the images the node keeps, for
// `kiln agent status`.
type Presence struct {
	Kept    int              `json:"kept"`    // images the node must hold now
	Missing []contract.Image `json:"missing"` // of those, not in local storage
}

// Check looks, changing nothing, for each of images in open's store.
func Check(open func() (storage.Store, error), images []contract.Image) (*Presence, error) {
	missing, err := missingIn(open, images)
	if err != nil {
		return nil, err
	}
	if missing == nil {
		missing = []contract.Image{}
	}
	return &Presence{Kept: len(images), Missing: missing}, nil
}
