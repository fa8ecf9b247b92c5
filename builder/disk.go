package builder

import (
	"context"
	"fmt"
	"os"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/units"
)

// renderIgnition renders the node's config: kiln's units and files for this
// partition, plus the recipe's own SSH keys and fragments.
func (b *build) renderIgnition(context.Context) error {
	r := b.recipe
	partGUID := partitions.DeriveGUID(b.seed(), contract.PartitionName)
	us, files, err := units.Render(units.ParamsFrom(b.contents, partGUID))
	if err != nil {
		return err
	}
	release, err := releaseFiles(r)
	if err != nil {
		return err
	}
	cfg := ignition.Config{Version: r.Ignition.Version, User: r.Ignition.User, SSHKeys: r.Ignition.SSHKeys, Units: us, Files: append(files, release...)}
	for _, p := range r.Ignition.Fragments {
		data, err := os.ReadFile(r.Resolve(p))
		if err != nil {
			return fmt.Errorf("ignition fragment: %w", err)
		}
		cfg.Fragments = append(cfg.Fragments, ignition.Fragment{Name: p, Data: data})
	}
	b.ignition, err = ignition.Render(cfg)
	return err
}

// assembleDisk writes the disk into the temporary output file.
func (b *build) assembleDisk(ctx context.Context) error {
	r := b.recipe
	opts := partitions.AssembleOptions{
		Output:          b.out,
		Base:            r.Resolve(r.Base.Path),
		BaseDigest:      r.Base.Digest,
		ImageTree:       b.root,
		Headroom:        r.ImagePartition.HeadroomPercent(),
		Compression:     r.ImagePartition.Compression,
		Placement:       r.ImagePartition.Placement,
		SourceDateEpoch: b.epoch,
		GUIDSeed:        b.seed(),
		Ignition:        b.ignition,
		Progress:        b.o.Progress,
	}
	if !r.Disk.Size.Auto {
		opts.DiskSize = r.Disk.Size.Bytes
	}
	if !r.ImagePartition.Size.Auto {
		opts.PartitionSize = r.ImagePartition.Size.Bytes
	}
	var err error
	b.layout, err = partitions.Assemble(ctx, opts)
	return err
}
