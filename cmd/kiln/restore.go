package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/agent/preloadcopy"
	"github.com/kiln-appliance/kiln/systemd/agent/release"
	"github.com/kiln-appliance/kiln/systemd/agent/restore"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func newRestoreImagesCommand() *cobra.Command {
	var flags releaseFlags
	cmd := &cobra.Command{
		Use:     "restore-images [PARTITION]",
		Short:   "At boot, after CRI-O: put back every kept image local storage lost",
		Example: `  kiln agent restore-images /var/lib/kiln/images`,
		Long: "Finds, by digest, every image the node must hold in local storage (the current, previous and tried\n" +
			"releases', a staged release's preloaded ones; served-only images are left to the registry when it runs\n" +
			"this boot) and copies each missing one back from the image partition (PARTITION, default " + contract.MountPoint + ")\n" +
			"or the release store, every blob checked against its digest. Exits 1, naming them, when some cannot be\n" +
			"restored.",
		Args: optionalPartitionArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			part := filepath.Join(flags.root, contract.MountPoint)
			if len(args) == 1 {
				part = args[0]
			}
			images, c, err := keptImages(flags.root, part)
			if err != nil {
				return err
			}
			src := restore.Sources{BlobDirs: []string{
				filepath.Join(flags.root, contract.ReleaseStore, "blobs"),
				filepath.Join(part, contract.OCIDir, "blobs"),
			}}
			if c.Registry.PreloadMode == contract.PreloadCopy {
				from := filepath.Join(part, contract.StorageDir)
				src.CopyPreloaded = func(ctx context.Context, ids []string) error {
					store, err := flags.openStore()
					if err != nil {
						return err
					}
					to := store.GraphRoot()
					// A running container's layers stay mounted: not an error here.
					if _, err := store.Shutdown(false); err != nil && !errors.Is(err, storage.ErrLayerUsedByContainer) {
						return err
					}
					return preloadcopy.CopyToMainStore(ctx, from, to, preloadcopy.WithOnly(ids...), preloadcopy.WithLog(cmd.OutOrStdout()))
				}
			}
			_, err = restore.Run(cmd.Context(), flags.openStore, images, src, cmd.OutOrStdout())
			return err
		},
	}
	flags.addRoot(cmd)
	return cmd
}

// keptImages is what the node must hold in local storage at this boot
// (restore.Needed), from its release state, or from the image partition's
// kiln.json when it has recorded none yet; and the partition's contents.
func keptImages(root, part string) ([]contract.Image, *contract.Contents, error) {
	c, err := contract.Read(part)
	if err != nil {
		return nil, nil, err
	}
	st, err := release.New(release.WithRoot(root)).Load()
	switch {
	case errors.Is(err, os.ErrNotExist):
		st = &state.State{SchemaVersion: state.Version, Current: release.FactoryRelease(c)}
	case err != nil:
		return nil, nil, err
	}
	return restore.Needed(st, registryRuns(root, c, st)), c, nil
}

// registryRuns says whether this boot runs the local registry: on the first
// boot (until its marker is written), on an upgrade boot, or always.
func registryRuns(root string, c *contract.Contents, st *state.State) bool {
	_, err := os.Stat(filepath.Join(root, contract.FirstBootMarker))
	return c.Registry.AlwaysOn || errors.Is(err, os.ErrNotExist) || st.Trying != nil
}
