package builder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/units"
)

// renderIgnition renders the node's config once before the long steps, so a
// bad fragment or unit parameter fails now; assembleDisk renders it again
// (ignitionFor) once the image partition's identity, which depends on its
// content (GUID and dm-verity root hash), is known.
func (b *build) renderIgnition(context.Context) error {
	_, err := b.ignitionFor(partitions.ImageIdentity{PartitionGUID: gpt.DeriveGUID(b.seed(), contract.PartitionName)})
	return err
}

// ignitionFor renders kiln's units and files for this partition, plus the
// recipe's own SSH keys and fragments.
func (b *build) ignitionFor(id partitions.ImageIdentity) ([]byte, error) {
	r := b.Recipe
	params := units.ParamsFrom(b.contents, id.PartitionGUID)
	if id.Verity != nil {
		params.RootHash, params.HashOffset = id.Verity.RootHash, id.Verity.HashOffset
	}
	params.Reboot, params.Window = r.Upgrade.Reboot, r.Upgrade.RebootWindow
	if r.Upgrade.RebootDelay != "" {
		d, err := time.ParseDuration(r.Upgrade.RebootDelay) // validated with the recipe
		if err != nil {
			return nil, fmt.Errorf("upgrade.rebootDelay: %w", err)
		}
		params.RebootDelay = d
	}
	params.Health = units.Health{Units: r.Upgrade.Health.Units, Command: r.Upgrade.Health.Command, UnhealthyExitCode: r.Upgrade.Health.UnhealthyExitCode}
	if r.Upgrade.Health.Timeout != "" {
		d, err := time.ParseDuration(r.Upgrade.Health.Timeout) // validated with the recipe
		if err != nil {
			return nil, fmt.Errorf("upgrade.health.timeout: %w", err)
		}
		params.Health.Timeout = d
	}
	us, files, err := units.Render(params)
	if err != nil {
		return nil, err
	}
	release, err := releaseFiles(r)
	if err != nil {
		return nil, err
	}
	cfg := ignition.Config{Version: r.Ignition.Version, User: r.Ignition.User, SSHKeys: r.Ignition.SSHKeys, Units: us, Files: append(files, release...)}
	for _, p := range r.Ignition.Fragments {
		data, err := inputfile.ReadFile(r.Resolve(p), -1)
		if err != nil {
			return nil, fmt.Errorf("ignition fragment: %w", err)
		}
		cfg.Fragments = append(cfg.Fragments, ignition.Fragment{Name: p, Data: data})
	}
	b.ignition, err = ignition.Render(cfg)
	return b.ignition, err
}

// assembleDisk writes the disk into the temporary output file.
func (b *build) assembleDisk(ctx context.Context) error {
	d := b.disk()
	d.Image.Tree = b.root
	d.SourceDateEpoch = b.Epoch
	d.GUIDSeed = b.seed()
	var err error
	if d.Image.Attrs, err = b.inPlaceAttrs(); err != nil {
		return err
	}
	kept := &verity.KeptTrees{Dir: filepath.Join(b.cache.Dir(), "verity"), StageDir: b.work}
	defer kept.Discard() // unless committed below
	opts := []partitions.Option{}
	if b.secureBoot != nil {
		opts = append(opts, partitions.WithESP(b.secureBoot.Write))
	}
	b.layout, err = partitions.Assemble(ctx, b.out.File, d, append(opts,
		partitions.WithIgnition(b.ignitionFor),
		partitions.WithFileHashes(b.inPlacePaths(), "check blobs read in place", b.checkInPlace),
		partitions.WithKeptTrees(kept, b.servedBlobs()),
		// Temporary files in the work directory: a killed build's go with it.
		partitions.WithTempDir(b.work),
		partitions.WithProgress(b.o.Progress))...)
	if err != nil {
		return b.sizeError(err)
	}
	if err := b.inPlaceUnchanged(); err != nil {
		return err
	}
	// Every blob's bytes now hold what its digest says (cached, hashed as
	// written, or in place and unchanged): the tree may be kept by them.
	if err := kept.Commit(); err != nil {
		fmt.Fprintf(b.o.Log, "warning: %v; the next build hashes the image partition again\n", err)
	}
	return nil
}

// disk is the recipe's choices for the disk: the base, the image
// partition's filesystem and place, and the fixed sizes.
func (b *build) disk() partitions.Disk {
	r := b.Recipe
	d := partitions.Disk{
		Base: partitions.Base{Path: r.Resolve(r.Base.Path), Digest: r.Base.Digest},
		Geometry: partitions.Geometry{
			Headroom:  r.ImagePartition.HeadroomPercent(),
			Placement: r.ImagePartition.Placement,
		},
		Image: partitions.Image{Compression: r.ImagePartition.Compression, NoVerity: !r.ImagePartition.VerityOn()},
	}
	if !r.Disk.Size.Auto {
		d.Geometry.DiskSize = r.Disk.Size.Bytes
	}
	if !r.ImagePartition.Size.Auto {
		d.Geometry.PartitionSize = r.ImagePartition.Size.Bytes
	}
	return d
}

// sizeError places a size the disk cannot be built with at the recipe line
// that sets it.
func (b *build) sizeError(err error) error {
	var se *partitions.SizeError
	if errors.As(err, &se) {
		return b.Recipe.Errorf(se.Field, "%v", se)
	}
	return err
}

// checkSizes refuses a fixed disk.size or imagePartition.size that cannot
// hold what is known to go on the disk so far: the node's kiln binary and,
// once the lock is known (lock not nil), the largest served image: with
// compression none the image filesystem stores its blobs as they are, so
// it holds at least that many bytes. It runs before the lock is written
// and before anything is fetched.
func (b *build) checkSizes(lock *recipes.Lock) error {
	r := b.Recipe
	if r.Disk.Size.Auto && r.ImagePartition.Size.Auto {
		return nil
	}
	fi, err := os.Stat(b.Agent.Path)
	if err != nil {
		return fmt.Errorf("agent binary: %w", err)
	}
	least := fi.Size()
	known := fmt.Sprintf("the node's kiln binary (%s)", human.Bytes(least))
	if lock != nil && r.ImagePartition.Compression == "none" {
		var largest recipes.LockedImage
		for _, img := range r.Images {
			if li, ok := lock.Image(img.Name); ok && img.Served() && li.Size > largest.Size {
				largest = li
			}
		}
		if largest.Size > 0 {
			least += largest.Size
			known += fmt.Sprintf(" and the largest served image, %s (%s as locked),", largest.Name, human.Bytes(largest.Size))
		}
	}
	d := b.disk()
	return b.sizeError(partitions.CheckSizes(d.Base.Path, d.Geometry, least, known))
}

// servedBlobs names every blob of the partition's OCI layout by its locked
// size and digest (the files the kept verity trees know: see
// partitions.WithKeptTrees).
func (b *build) servedBlobs() map[string]squashfs.FileDigest {
	known := map[string]squashfs.FileDigest{}
	for _, fi := range b.images {
		if !fi.recipe.Served() {
			continue
		}
		for _, d := range append([]v1.Descriptor{fi.image.Descriptor}, fi.image.Blobs()...) {
			known[blobName(d.Digest)] = squashfs.FileDigest{Size: d.Size, Digest: d.Digest.String()}
		}
	}
	return known
}
