package bundleimport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/opencontainers/go-digest"
	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/localimage"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
)

// loadImages puts every preloaded image of m into store as a pull by
// containers/image would: each layer applied from its blob (blobPath finds
// it in the release store or on the image partition) under c/image's layer
// ID, its DiffID checked; then the image record, ID the config digest, with
// the manifest and config under c/image's keys, so CRI-O finds it by the
// digest the lock recorded. Images and layers already there are kept, so a
// re-run only adds what is missing. containers/image's copy is not used:
// the node edition does not link it (docs/architecture.md).
func loadImages(ctx context.Context, store storage.Store, m *bundle.Manifest, blobPath func(string) (string, error), log io.Writer) error {
	var todo []bundle.Image
	for _, img := range m.Images {
		if !img.Preloaded {
			continue
		}
		ids, err := localimage.Find(store, contract.Image{Name: img.Name, Digest: img.Digest, ImageID: img.ImageID})
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			todo = append(todo, img)
		}
	}
	for n, img := range todo {
		if err := ctx.Err(); err != nil {
			return err
		}
		fmt.Fprintf(log, "  loading image %d of %d: %s\n", n+1, len(todo), img.Name)
		if err := loadImage(store, img, blobPath); err != nil {
			return fmt.Errorf("load %s into containers/storage: %w", img.Name, err)
		}
	}
	return nil
}

func loadImage(store storage.Store, img bundle.Image, blobPath func(string) (string, error)) error {
	if len(img.Blobs) == 0 {
		return errors.New("the manifest lists no config blob")
	}
	manifest, err := readBlob(img.Digest, blobPath)
	if err != nil {
		return err
	}
	config, err := readBlob(img.Blobs[0], blobPath)
	if err != nil {
		return err
	}
	var cfg struct {
		RootFS struct {
			DiffIDs []digest.Digest `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil {
		return fmt.Errorf("image config %s: %w", img.Blobs[0], err)
	}
	layers := img.Blobs[1:]
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return fmt.Errorf("image config lists %d layers, the manifest %d", len(cfg.RootFS.DiffIDs), len(layers))
	}
	parent := ""
	for i, blob := range layers {
		id, err := putLayer(store, parent, digest.Digest(blob), cfg.RootFS.DiffIDs[i], blobPath)
		if err != nil {
			return fmt.Errorf("layer %s: %w", blob, err)
		}
		parent = id
	}
	md := digest.Digest(img.Digest)
	var names []string
	if !strings.Contains(img.Name, "@") {
		names = []string{img.Name}
	}
	_, err = store.CreateImage(strings.TrimPrefix(img.ImageID, "sha256:"), names, parent, "", &storage.ImageOptions{
		Digest: md,
		BigData: []storage.ImageBigDataOption{
			{Key: storage.ImageDigestManifestBigDataNamePrefix + "-" + md.String(), Data: manifest, Digest: md},
			{Key: storage.ImageDigestBigDataKey, Data: manifest, Digest: md},
			{Key: img.ImageID, Data: config, Digest: digest.Digest(img.ImageID)},
		},
	})
	if errors.Is(err, storage.ErrDuplicateID) {
		return fmt.Errorf("containers/storage holds image %s with another manifest; remove it (podman rmi) and import again", img.ImageID)
	}
	return err
}

// putLayer applies the layer blob (compressed or not) on parent under the
// ID containers/image gives it, unless it is there, and checks its DiffID.
func putLayer(store storage.Store, parent string, blob, diffID digest.Digest, blobPath func(string) (string, error)) (string, error) {
	id := diffID.Encoded()
	if parent != "" {
		id = digest.Canonical.FromString(parent + "+" + diffID.Encoded()).Encoded()
	}
	if _, err := store.Layer(id); err == nil {
		return id, nil
	}
	p, err := blobPath(blob.String())
	if err != nil {
		return "", err
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	l, _, err := store.PutLayer(id, parent, nil, "", false, &storage.LayerOptions{OriginalDigest: blob, UncompressedDigest: diffID}, f)
	if err != nil {
		return "", fmt.Errorf("apply: %w", err)
	}
	if l.UncompressedDigest != diffID || l.CompressedDigest != "" && l.CompressedDigest != blob {
		derr := store.DeleteLayer(id)
		return "", errors.Join(fmt.Errorf("%w: unpacked it is %s (packed %s), the image config says %s", bundle.ErrDamaged, l.UncompressedDigest, l.CompressedDigest, diffID), derr)
	}
	return id, nil
}

// readBlob reads a small blob (a manifest or a config) and checks its digest.
func readBlob(d string, blobPath func(string) (string, error)) ([]byte, error) {
	p, err := blobPath(d)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	if got := digest.FromBytes(data); got.String() != d {
		return nil, fmt.Errorf("%w: blob %s reads as %s", bundle.ErrDamaged, d, got)
	}
	return data, nil
}
