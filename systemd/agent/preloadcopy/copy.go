// Package preloadcopy copies images of the preloaded containers/storage
// store (the image partition's storage/, built by builder/preload) into the
// node's main store, digests preserved: every one at first boot in the
// preload's mode copy, and those a kept release needs when the image
// restore puts back what CRI-O lost. (Mode store needs no program: the
// factory writes the storage.conf that adds the partition's store,
// contract.StorageConfig.)
package preloadcopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"go.podman.io/storage"
	"go.podman.io/storage/pkg/archive"
	"go.podman.io/storage/types"
	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// CopyOption tunes CopyToMainStore.
type CopyOption func(*copyOptions)

type copyOptions struct {
	runRoot string
	log     io.Writer
	only    map[string]bool
}

// WithOnly copies only the images with these IDs (default: every image of
// the preloaded store): the node's image restore asks for the images a kept
// release needs, not for those of releases it retired.
func WithOnly(ids ...string) CopyOption {
	return func(o *copyOptions) {
		o.only = map[string]bool{}
		for _, id := range ids {
			o.only[id] = true
		}
	}
}

// WithLog sets where progress lines go (default stderr, the journal under
// systemd).
func WithLog(w io.Writer) CopyOption { return func(o *copyOptions) { o.log = w } }

// CopyToMainStore copies every image of the preloaded store at fromStore
// (read-only) into the main store at toStore: same layer IDs, image IDs,
// names, manifests and manifest digests, so CRI-O finds an image by the
// digest the lock recorded. Images already in the main store are skipped,
// so running it again is a cheap no-op. Before copying anything it checks
// toStore's filesystem has room for the unpacked layers. The main store is
// opened with the node's storage.conf settings (driver and its options).
//
// Layers are copied with containers/storage itself, not containers/image:
// a copy through c/image would hand over uncompressed layers and so change
// the manifest (and its digest); here the exact layer tar is re-created
// from the store's tar-split data and its DiffID verified.
func CopyToMainStore(ctx context.Context, fromStore, toStore string, opts ...CopyOption) (err error) {
	o := copyOptions{runRoot: contract.DefaultRunRoot, log: os.Stderr}
	for _, opt := range opts {
		opt(&o)
	}
	logf := func(format string, a ...any) { fmt.Fprintf(o.log, "preload-copy: "+format+"\n", a...) }
	if _, err := os.Stat(filepath.Join(fromStore, "overlay-images", "images.json")); err != nil {
		return fmt.Errorf("preload-copy: %s is not a preloaded containers/storage store (%v); is the kiln image partition mounted?", fromStore, err)
	}

	// The preloaded store is read-only: reach it as the additional image
	// store of a throwaway empty store, the way podman would.
	tmp, err := os.MkdirTemp("", "kiln-preload-copy-")
	if err != nil {
		return fmt.Errorf("preload-copy: %w", err)
	}
	defer os.RemoveAll(tmp)
	src, err := storage.GetStore(storage.StoreOptions{
		GraphRoot:          filepath.Join(tmp, "root"),
		RunRoot:            filepath.Join(tmp, "run"),
		GraphDriverName:    "overlay",
		GraphDriverOptions: []string{"overlay.skip_mount_home=true", "overlay.imagestore=" + fromStore},
	})
	if err != nil {
		return fmt.Errorf("preload-copy: open preloaded store %s: %w", fromStore, err)
	}
	defer src.Shutdown(true) //nolint:errcheck // read-only, nothing mounted

	dstOpts, err := types.DefaultStoreOptions()
	if err != nil {
		return fmt.Errorf("preload-copy: read storage.conf: %w", err)
	}
	dstOpts.GraphRoot, dstOpts.RunRoot = toStore, o.runRoot
	if dstOpts.GraphDriverName == "" {
		dstOpts.GraphDriverName = "overlay"
	}
	var driverOpts []string
	for _, d := range dstOpts.GraphDriverOptions {
		if !strings.Contains(d, "imagestore=") { // copy mode: the main store stands alone
			driverOpts = append(driverOpts, d)
		}
	}
	dstOpts.GraphDriverOptions = driverOpts
	dst, err := storage.GetStore(dstOpts)
	if err != nil {
		return fmt.Errorf("preload-copy: open main store %s: %w", toStore, err)
	}
	defer func() {
		// Layers of running containers stay mounted (the node's restore may
		// copy while CRI-O runs): not an error of the copy.
		if _, serr := dst.Shutdown(false); serr != nil && err == nil && !errors.Is(serr, storage.ErrLayerUsedByContainer) {
			err = fmt.Errorf("preload-copy: close main store %s: %w", toStore, serr)
		}
	}()

	images, err := src.Images()
	if err != nil {
		return fmt.Errorf("preload-copy: list preloaded images: %w", err)
	}
	sort.Slice(images, func(i, j int) bool { return images[i].ID < images[j].ID })
	if o.only != nil {
		images = slices.DeleteFunc(images, func(img storage.Image) bool { return !o.only[img.ID] })
	}

	// Plan first, so a full disk fails before anything is written.
	var todo []storage.Image
	var need int64
	planned := map[string]bool{}
	for _, img := range images {
		if _, err := dst.Image(img.ID); err == nil {
			// Present: only make sure it carries every preloaded name.
			if err := dst.AddNames(img.ID, img.Names); err != nil {
				return fmt.Errorf("preload-copy: name %s: %w", name(img), err)
			}
			logf("%s (%s): already in the main store, skipped", name(img), img.Digest)
			continue
		}
		chain, err := layerChain(src, img.TopLayer)
		if err != nil {
			return fmt.Errorf("preload-copy: %s: %w", name(img), err)
		}
		for _, l := range chain {
			if _, err := dst.Layer(l.ID); err != nil && !planned[l.ID] {
				planned[l.ID] = true
				need += l.UncompressedSize
			}
		}
		todo = append(todo, img)
	}
	if len(todo) == 0 {
		logf("all %d preloaded images are in the main store", len(images))
		return nil
	}
	if err := checkSpace(toStore, need); err != nil {
		return err
	}
	for _, img := range todo {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("preload-copy: %w", err)
		}
		start := time.Now()
		n, err := copyImage(src, dst, img)
		if err != nil {
			return fmt.Errorf("preload-copy: %s (%s): %w", name(img), img.Digest, err)
		}
		logf("%s (%s): copied %d new layers in %s", name(img), img.Digest, n, time.Since(start).Round(time.Millisecond))
	}
	logf("%d preloaded images: %d copied, %d already present", len(images), len(todo), len(images)-len(todo))
	return nil
}

// name picks an image's tagged name for messages.
func name(img storage.Image) string {
	for _, n := range img.Names {
		if !strings.Contains(n, "@") {
			return n
		}
	}
	if len(img.Names) > 0 {
		return img.Names[0]
	}
	return img.ID
}

// layerChain lists the layers under top, base first.
func layerChain(s storage.Store, top string) ([]*storage.Layer, error) {
	var chain []*storage.Layer
	for id := top; id != ""; {
		l, err := s.Layer(id)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", id, err)
		}
		chain = append([]*storage.Layer{l}, chain...)
		id = l.Parent
	}
	return chain, nil
}

// checkSpace fails when the filesystem holding dir (or its nearest existing
// parent) has less than need bytes, plus 10 % for metadata, available.
func checkSpace(dir string, need int64) error {
	p := dir
	var st unix.Statfs_t
	for {
		err := unix.Statfs(p, &st)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) || p == filepath.Dir(p) {
			return fmt.Errorf("preload-copy: free space of %s: %w", dir, err)
		}
		p = filepath.Dir(p)
	}
	avail := int64(st.Bavail) * st.Bsize
	if want := need + need/10; avail < want {
		return fmt.Errorf("preload-copy: %s has %d MiB free, copying the preloaded images needs %d MiB; nothing was copied. Free space there or grow the disk, or build the appliance with preload mode \"store\", which needs no copy",
			dir, avail>>20, want>>20)
	}
	return nil
}

// copyImage copies img's missing layers, then the image record with every
// big-data item (manifests, config) and digest, and checks the result. It
// returns the number of layers copied.
func copyImage(src, dst storage.Store, img storage.Image) (int, error) {
	chain, err := layerChain(src, img.TopLayer)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range chain {
		if _, err := dst.Layer(l.ID); err == nil {
			continue // shared with an image copied earlier, or already there
		}
		if err := copyLayer(src, dst, l); err != nil {
			return n, fmt.Errorf("layer %s: %w", l.ID, err)
		}
		n++
	}
	keys, err := src.ListImageBigData(img.ID)
	if err != nil {
		return n, err
	}
	var big []storage.ImageBigDataOption
	for _, k := range keys {
		data, err := src.ImageBigData(img.ID, k)
		if err != nil {
			return n, fmt.Errorf("read %s: %w", k, err)
		}
		d, err := src.ImageBigDataDigest(img.ID, k)
		if err != nil {
			return n, fmt.Errorf("read %s: %w", k, err)
		}
		big = append(big, storage.ImageBigDataOption{Key: k, Data: data, Digest: d})
	}
	_, err = dst.CreateImage(img.ID, img.Names, img.TopLayer, img.Metadata, &storage.ImageOptions{
		CreationDate: img.Created,
		Digest:       img.Digest,
		Digests:      img.Digests,
		BigData:      big,
		NamesHistory: img.NamesHistory,
	})
	if err != nil {
		return n, fmt.Errorf("create image: %w", err)
	}
	got, err := dst.Image(img.ID)
	if err != nil {
		return n, err
	}
	if got.Digest != img.Digest {
		return n, fmt.Errorf("main store recorded manifest digest %s, want %s", got.Digest, img.Digest)
	}
	return n, nil
}

// copyLayer streams one layer's exact tar from src into dst and verifies
// its DiffID; a layer that fails verification is removed again.
func copyLayer(src, dst storage.Store, l *storage.Layer) error {
	uncompressed := archive.Uncompressed
	diff, err := src.Diff("", l.ID, &storage.DiffOptions{Compression: &uncompressed})
	if err != nil {
		return fmt.Errorf("read preloaded layer: %w", err)
	}
	defer diff.Close()
	want := l.UncompressedDigest
	if want == "" {
		return errors.New("the preloaded layer records no DiffID, so a copy cannot be verified")
	}
	h := want.Algorithm().Digester()
	opts := &storage.LayerOptions{OriginalDigest: l.CompressedDigest, UncompressedDigest: want}
	if l.CompressedDigest != "" {
		size := l.CompressedSize
		opts.OriginalSize = &size
	}
	tee := io.TeeReader(diff, h.Hash())
	if _, _, err := dst.PutLayer(l.ID, l.Parent, nil, "", false, opts, tee); err != nil {
		return fmt.Errorf("write layer: %w", err)
	}
	// The unpacker may stop at the tar's end marker; hash the padding too.
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return fmt.Errorf("read preloaded layer: %w", err)
	}
	if got := h.Digest(); got != want {
		if derr := dst.DeleteLayer(l.ID); derr != nil {
			return fmt.Errorf("layer content hashes to %s, want %s, and removing it failed: %v", got, want, derr)
		}
		return fmt.Errorf("layer content hashes to %s, want %s; the preloaded store is damaged: reflash the appliance", got, want)
	}
	return nil
}
