package localimage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// ErrDamaged marks content that does not match its digest.
var ErrDamaged = errors.New("content does not match its digest")

// BlobDirs finds a blob by digest in the first of its directories that holds
// it; each is laid out as an OCI layout's blobs/ (<dir>/<alg>/<hex>). The
// node's are the release store's and the image partition's.
type BlobDirs []string

// Path returns where blob d is, or an error naming every place looked at.
func (b BlobDirs) Path(d string) (string, error) {
	alg, hx, ok := strings.Cut(d, ":")
	if !ok || strings.ContainsAny(alg+hx, `/\`) || alg == ".." || hx == ".." {
		return "", fmt.Errorf("blob %q is not a digest", d)
	}
	for _, dir := range b {
		p := filepath.Join(dir, alg, hx)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("blob %s is in none of %s", d, strings.Join(b, ", "))
}

// Load puts im into store as a pull by containers/image would: its manifest
// and config read from blobs and checked against their digests, each layer
// applied from its blob (compressed or not) under c/image's layer ID with its
// DiffID checked, then the image record (ID the config digest) with the
// manifest and config under c/image's keys, so CRI-O and podman find it by the
// digest the lock recorded and by its name. Layers already in the store are
// kept, so loading again only adds what is missing. containers/image's copy
// is not used: the node edition does not link it (docs/architecture.md).
func Load(store storage.Store, im contract.Image, blobs BlobDirs) error {
	manifest, err := readBlob(im.Digest, blobs)
	if err != nil {
		return err
	}
	var m struct {
		MediaType string `json:"mediaType"`
		Config    struct {
			Digest string `json:"digest"`
		} `json:"config"`
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(manifest, &m); err != nil || m.Config.Digest == "" {
		return fmt.Errorf("manifest %s is not an image manifest (%v)", im.Digest, err)
	}
	if id := strings.TrimPrefix(im.ImageID, "sha256:"); id != "" && m.Config.Digest != digest.NewDigestFromEncoded(digest.SHA256, id).String() {
		return fmt.Errorf("%w: manifest %s names config %s, the release says %s", ErrDamaged, im.Digest, m.Config.Digest, im.ImageID)
	}
	config, err := readBlob(m.Config.Digest, blobs)
	if err != nil {
		return err
	}
	var cfg struct {
		RootFS struct {
			DiffIDs []digest.Digest `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil {
		return fmt.Errorf("image config %s: %w", m.Config.Digest, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return fmt.Errorf("image config lists %d layers, the manifest %d", len(cfg.RootFS.DiffIDs), len(m.Layers))
	}
	parent := ""
	for i, l := range m.Layers {
		id, err := putLayer(store, parent, digest.Digest(l.Digest), cfg.RootFS.DiffIDs[i], blobs)
		if err != nil {
			return fmt.Errorf("layer %s: %w", l.Digest, err)
		}
		parent = id
	}
	md := digest.Digest(im.Digest)
	var names []string
	if !strings.Contains(im.Name, "@") {
		names = []string{im.Name}
	}
	_, err = store.CreateImage(strings.TrimPrefix(m.Config.Digest, "sha256:"), names, parent, "", &storage.ImageOptions{
		Digest: md,
		BigData: []storage.ImageBigDataOption{
			{Key: storage.ImageDigestManifestBigDataNamePrefix + "-" + md.String(), Data: manifest, Digest: md},
			{Key: storage.ImageDigestBigDataKey, Data: manifest, Digest: md},
			{Key: m.Config.Digest, Data: config, Digest: digest.Digest(m.Config.Digest)},
		},
	})
	if errors.Is(err, storage.ErrDuplicateID) {
		return fmt.Errorf("containers/storage holds image %s with another manifest; remove it (podman rmi) and try again", m.Config.Digest)
	}
	return err
}

// putLayer applies the layer blob (compressed or not) on parent under the
// ID containers/image gives it, unless it is there, and checks its DiffID.
func putLayer(store storage.Store, parent string, blob, diffID digest.Digest, blobs BlobDirs) (string, error) {
	id := diffID.Encoded()
	if parent != "" {
		id = digest.Canonical.FromString(parent + "+" + diffID.Encoded()).Encoded()
	}
	if _, err := store.Layer(id); err == nil {
		return id, nil
	}
	p, err := blobs.Path(blob.String())
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
		// Say "damaged" when it is: the unpacker's own words ("invalid tar
		// header") do not tell a technician the stored copy is bad.
		if got, _, herr := filedigest.Of(p); herr == nil && got != blob.String() {
			return "", fmt.Errorf("%w: %s reads as %s", ErrDamaged, p, got)
		}
		return "", fmt.Errorf("apply: %w", err)
	}
	if l.UncompressedDigest != diffID || l.CompressedDigest != "" && l.CompressedDigest != blob {
		derr := store.DeleteLayer(id)
		return "", errors.Join(fmt.Errorf("%w: unpacked it is %s (packed %s), the image config says %s", ErrDamaged, l.UncompressedDigest, l.CompressedDigest, diffID), derr)
	}
	return id, nil
}

// readBlob reads a small blob (a manifest or a config, bounded by
// contract.MaxManifestSize) and checks its digest.
func readBlob(d string, blobs BlobDirs) ([]byte, error) {
	p, err := blobs.Path(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, contract.MaxManifestSize+1))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d, err)
	}
	if len(data) > contract.MaxManifestSize {
		return nil, fmt.Errorf("blob %s (%s) is larger than a manifest or config may be (%d bytes)", d, p, contract.MaxManifestSize)
	}
	if got := digest.FromBytes(data); got.String() != d {
		return nil, fmt.Errorf("%w: blob %s reads as %s (%s)", ErrDamaged, d, got, p)
	}
	return data, nil
}
