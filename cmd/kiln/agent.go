package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.podman.io/storage"
	stypes "go.podman.io/storage/types"

	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/agent/firstboot"
	"github.com/kiln-appliance/kiln/systemd/agent/gate"
	"github.com/kiln-appliance/kiln/systemd/agent/pins"
	"github.com/kiln-appliance/kiln/systemd/agent/preloadcopy"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func init() { subcommands = append(subcommands, newAgentCommand) }

// newAgentCommand groups the programs kiln's units run on the node. Each
// reads the image partition's kiln.json; none needs the recipe.
func newAgentCommand() *cobra.Command {
	agent := &cobra.Command{
		Use:   "agent",
		Short: "On-node programs run by kiln's systemd units",
		Example: `  kiln agent status                   # the node's releases, pins and images
  kiln agent import /dev/sdb2         # an upgrade stick's bundle partition`,
		// The factory's kiln has them too, but they run on the node: its
		// help lists them; the factory's does not (they still run).
		Hidden: version.Current().Edition != version.Node,
	}
	agent.AddCommand(newMirrorGateCommand(), newWaitImagesCommand(), newWritePinsCommand(), newPreloadCopyCommand(),
		newStatusCommand(), newReleaseCommand(), newImportCommand(), newReflashCommand(), newRestoreImagesCommand())
	return agent
}

// optionalPartitionArg takes at most one argument, the mounted image
// partition (default contract.MountPoint under the node's root).
func optionalPartitionArg(cmd *cobra.Command, args []string) error {
	if len(args) > 1 {
		return usageError{fmt.Errorf("%s: at most one argument, the mounted image partition, got %d", cmd.CommandPath(), len(args))}
	}
	return nil
}

// partitionArg takes the one PARTITION argument (a mounted image partition).
func partitionArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{fmt.Errorf("%s: want one argument, the mounted image partition (e.g. %s), got %d", cmd.CommandPath(), contract.MountPoint, len(args))}
	}
	return nil
}

func newMirrorGateCommand() *cobra.Command {
	var (
		timeout   time.Duration
		dropIn    string
		remove    bool
		stateFile string
	)
	cmd := &cobra.Command{
		Use:   "mirror-gate PARTITION",
		Short: "Point the runtime at the local registry once it serves the partition's images",
		Example: `  kiln agent mirror-gate --timeout 120s --state /var/lib/kiln/state.json /var/lib/kiln/images
  kiln agent mirror-gate --remove /var/lib/kiln/images`,
		Long: "Waits until the local registry answers GET /v2/ and serves every image of PARTITION/kiln.json\n" +
			"by digest, then writes the registries.conf drop-in that mirrors their hosts to it.\n" +
			"With --state, also waits for the images of the release the node runs (the one being tried at an\n" +
			"upgrade boot) and mirrors the hosts of every release the registry serves.\n" +
			"With --remove, removes the drop-in instead.",
		Args: partitionArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := contract.Read(args[0])
			if err != nil {
				return err
			}
			g, err := gate.New(c)
			if err != nil {
				return err
			}
			g.DropIn, g.Log = dropIn, cmd.OutOrStdout()
			if stateFile != "" && !remove {
				switch st, err := state.Read(stateFile); {
				case errors.Is(err, os.ErrNotExist):
					fmt.Fprintf(g.Log, "no release state at %s: waiting for the image partition's images only\n", stateFile)
				case err != nil:
					return fmt.Errorf("mirror gate: %w (check it with `kiln agent status`)", err)
				default:
					if err := g.AddState(st); err != nil {
						return fmt.Errorf("mirror gate: %w", err)
					}
				}
			}
			if remove {
				return g.Close()
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return g.Open(ctx)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the registry")
	cmd.Flags().StringVar(&dropIn, "drop-in", contract.MirrorDropIn, "registries.conf drop-in to write")
	cmd.Flags().BoolVar(&remove, "remove", false, "remove the drop-in and exit")
	cmd.Flags().StringVar(&stateFile, "state", "", "also wait for the active release of this release state file (on a node "+contract.StateFile+"; missing: the partition's images only)")
	return cmd
}

func newWaitImagesCommand() *cobra.Command {
	var (
		timeout, interval     time.Duration
		marker, stateFile     string
		root, runRoot, driver string
		storageOpts           []string
	)
	cmd := &cobra.Command{
		Use:   "wait-images PARTITION",
		Short: "Wait until local storage holds every image of the partition; mark first boot",
		Example: `  kiln agent wait-images --timeout 600s --marker /var/lib/kiln/firstboot.done /var/lib/kiln/images
  kiln agent wait-images --state /var/lib/kiln/state.json /var/lib/kiln/images`,
		Long: "Polls the node's containers/storage (as configured in /etc/containers/storage.conf, including\n" +
			"additional image stores) until it holds every image of PARTITION/kiln.json, by digest; with\n" +
			"--state, every image of the release the node runs instead (after an upgrade).\n" +
			"On success writes --marker (when set); on timeout lists what is missing and fails.",
		Args: partitionArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := contract.Read(args[0])
			if err != nil {
				return err
			}
			images := c.Images
			if stateFile != "" {
				st, err := state.Read(stateFile)
				if err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
				if err == nil { // else nothing recorded: the partition's release
					images = st.Active().Images
				}
			}
			store, err := openNodeStore(func(opts *stypes.StoreOptions) {
				if root != "" {
					opts.GraphRoot = root
				}
				if runRoot != "" {
					opts.RunRoot = runRoot
				}
				if driver != "" {
					opts.GraphDriverName = driver
				}
				opts.GraphDriverOptions = append(opts.GraphDriverOptions, storageOpts...)
			})
			if err != nil {
				return err
			}
			defer store.Shutdown(false)

			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if err := firstboot.Wait(ctx, store, images, interval, cmd.OutOrStdout()); err != nil {
				return err
			}
			if marker == "" {
				return nil
			}
			if err := firstboot.MarkDone(marker, images); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: the local registry will not start at the next boot\n", marker)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", time.Hour, "how long to wait")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Second, "how often to look")
	cmd.Flags().StringVar(&marker, "marker", "", "file to write once every image is present (e.g. "+contract.FirstBootMarker+")")
	cmd.Flags().StringVar(&stateFile, "state", "", "wait for the images of this release state's active release instead (on a node "+contract.StateFile+")")
	cmd.Flags().StringVar(&root, "root", "", "containers/storage graph root (default: from storage.conf)")
	cmd.Flags().StringVar(&runRoot, "runroot", "", "containers/storage run root (default: from storage.conf)")
	cmd.Flags().StringVar(&driver, "storage-driver", "", "containers/storage driver (default: from storage.conf)")
	cmd.Flags().StringArrayVar(&storageOpts, "storage-opt", nil, "extra storage driver option, e.g. imagestore=/path (repeatable)")
	return cmd
}

func newWritePinsCommand() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:     "write-pins PARTITION",
		Short:   "Write CRI-O's image pins for every image of the partition",
		Example: `  kiln agent write-pins /var/lib/kiln/images && systemctl reload crio`,
		Long: "Atomically replaces --path with a crio.conf.d drop-in pinning every image of PARTITION/kiln.json\n" +
			"by digest and by name. Reload CRI-O afterwards (systemctl reload crio).",
		Args: partitionArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := contract.Read(args[0])
			if err != nil {
				return err
			}
			if err := pins.Write(path, c.Images); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pinned %d image(s) in %s\n", len(c.Images), path)
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "path", contract.PinsDropIn, "CRI-O drop-in to write")
	return cmd
}

func newPreloadCopyCommand() *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:     "preload-copy --from STORE --to STORE",
		Short:   "Copy every preloaded image into the node's main store (preload mode copy)",
		Example: `  kiln agent preload-copy --from /var/lib/kiln/images/storage --to /var/lib/containers/storage`,
		Long: "Copies each image of the preloaded store (--from, on the image partition) into the main store (--to),\n" +
			"keeping image IDs and digests. Images already there are skipped, so running it again is cheap.",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return preloadcopy.CopyToMainStore(cmd.Context(), from, to, preloadcopy.WithLog(cmd.OutOrStdout()))
		},
	}
	cmd.Flags().StringVar(&from, "from", contract.StorePath, "the preloaded store")
	cmd.Flags().StringVar(&to, "to", contract.DefaultGraphRoot, "the node's main store")
	return cmd
}

// openNodeStore opens the node's containers/storage as storage.conf
// configures it (the store CRI-O and podman use), adjusted by adjust.
func openNodeStore(adjust func(*stypes.StoreOptions)) (storage.Store, error) {
	opts, err := stypes.DefaultStoreOptions()
	if err != nil {
		return nil, fmt.Errorf("read containers/storage configuration: %w", err)
	}
	adjust(&opts)
	store, err := storage.GetStore(opts)
	if err != nil {
		return nil, fmt.Errorf("open containers/storage at %s: %w", opts.GraphRoot, err)
	}
	return store, nil
}
