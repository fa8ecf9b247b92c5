package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/systemd/agent/registry"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func init() { subcommands = append(subcommands, newServeCommand) }

func newServeCommand() *cobra.Command {
	var (
		listen       string
		anyInterface bool
		state, store string
	)
	cmd := &cobra.Command{
		Use:   "serve [--listen ADDR] [--state FILE] DIR...",
		Short: "Serve OCI layouts (or mounted image partitions) as a read-only local registry",
		Example: `  kiln serve /var/lib/kiln/images
  kiln serve --listen 127.0.0.1:5050 --state /var/lib/kiln/state.json /var/lib/kiln/images`,
		Long: `Serve one or more OCI image layouts as a pull-only OCI distribution registry.
Each DIR is an OCI layout, or a mounted kiln image partition (DIR/kiln.json; DIR/oci is served).
Repositories carry their upstream host: quay.io/acme/app:1.2 is /v2/quay.io/acme/app/manifests/1.2.
With --state, also serves the releases the node's release state keeps and runs or may roll back to
(the one being tried, the current one, the previous one), blobs from the release store and then DIR;
their tags win over DIR's.
Tells systemd READY=1 once the index is loaded and the listener accepts; stops on SIGTERM.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{fmt.Errorf("serve: give at least one OCI layout or image partition directory")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, dirs []string) error {
			// The same rule as the units: a registry the node's units would
			// refuse is not started by hand either, unless asked for.
			if err := contract.CheckListen(listen); err != nil && !anyInterface {
				return usageError{fmt.Errorf("serve: --listen %v. The registry has no authentication: whoever reaches "+
					"the address can pull every image. To serve beyond this host on purpose, add --allow-non-loopback", err)}
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			opts := []registry.Option{registry.WithLogger(log)}
			if state != "" {
				opts = append(opts, registry.WithReleaseState(state, store))
			}
			if err := registry.Run(cmd.Context(), listen, dirs, opts...); err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", contract.DefaultListen, "address to listen on: a loopback IP and a port from 1024 (host:port)")
	cmd.Flags().StringVar(&state, "state", "", "also serve the releases of this release state file (on a node "+contract.StateFile+"; missing: DIR only)")
	cmd.Flags().StringVar(&store, "release-store", contract.ReleaseStore, "the release store holding the releases' blobs (blobs/sha256/<hex>)")
	cmd.Flags().BoolVar(&anyInterface, "allow-non-loopback", false, "accept any --listen address (a non-loopback IP, a port below 1024): the registry has no authentication")
	return cmd
}
