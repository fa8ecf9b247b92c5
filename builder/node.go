package builder

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/preload"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/units"
)

// preloadImages writes the preloaded images into a containers/storage store
// at root/storage. They are read from a throwaway OCI layout in work (not the
// partition's own, which holds only the served images).
func preloadImages(ctx context.Context, root, work string, cache *fetch.Cache, images []stage.Image, epoch int64, arch string, o Options) error {
	src := filepath.Join(work, "preload-src")
	if err := stage.WriteLayout(src, blobPath(cache), images); err != nil {
		return err
	}
	var pi []preload.Image
	for _, img := range images {
		pi = append(pi, preload.Image{Name: img.Ref, LayoutDir: src, Digest: img.Manifest.Digest.String()})
	}
	_, err := preload.Build(ctx, filepath.Join(root, contract.StorageDir), pi,
		preload.WithPlatform("linux", arch, ""),
		preload.WithTime(time.Unix(epoch, 0)),
		preload.WithProgress(o.Progress))
	return err
}

// renderIgnition renders the node's config: kiln's units and files for this
// partition, plus the recipe's own SSH keys and fragments.
func renderIgnition(r *recipes.Recipe, c *contract.Contents, id partitions.ImageIdentity) ([]byte, error) {
	p := units.ParamsFrom(c, id.PartitionGUID)
	if id.Verity != nil {
		p.RootHash, p.HashOffset = id.Verity.RootHash, id.Verity.HashOffset
	}
	units, files, err := units.Render(p)
	if err != nil {
		return nil, err
	}
	cfg := ignition.Config{Version: r.Ignition.Version, User: r.Ignition.User, SSHKeys: r.Ignition.SSHKeys}
	for _, u := range units {
		cfg.Units = append(cfg.Units, ignition.Unit(u))
	}
	for _, f := range files {
		cfg.Files = append(cfg.Files, ignition.File(f))
	}
	for _, p := range r.Ignition.Fragments {
		data, err := os.ReadFile(r.Resolve(p))
		if err != nil {
			return nil, fmt.Errorf("ignition fragment: %w", err)
		}
		cfg.Fragments = append(cfg.Fragments, ignition.Fragment{Name: p, Data: data})
	}
	return ignition.Render(cfg)
}

// assemble writes the disk into out.
// The Ignition config is rendered once the image partition's identity (its
// GUID and verity root hash, which depend on its content) is known.
func assemble(ctx context.Context, out *os.File, r *recipes.Recipe, c *contract.Contents, root string, seed []byte, epoch int64, o Options) (*partitions.Layout, error) {
	opts := partitions.AssembleOptions{
		Output:          out,
		Base:            r.Resolve(r.Base.Path),
		BaseDigest:      r.Base.Digest,
		ImageTree:       root,
		Headroom:        r.ImagePartition.HeadroomPercent(),
		Compression:     r.ImagePartition.Compression,
		Placement:       r.ImagePartition.Placement,
		SourceDateEpoch: epoch,
		GUIDSeed:        seed,
		Ignition:        func(id partitions.ImageIdentity) ([]byte, error) { return renderIgnition(r, c, id) },
		NoVerity:        !r.ImagePartition.VerityOn(),
		Progress:        o.Progress,
	}
	if !r.Disk.Size.Auto {
		opts.DiskSize = r.Disk.Size.Bytes
	}
	if !r.ImagePartition.Size.Auto {
		opts.PartitionSize = r.ImagePartition.Size.Bytes
	}
	return partitions.Assemble(ctx, opts)
}
