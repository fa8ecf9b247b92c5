package main

import (
	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/systemd/agent/bundleimport"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func newImportCommand() *cobra.Command {
	var (
		flags releaseFlags
		retry bool
	)
	cmd := &cobra.Command{
		Use:   "import SOURCE",
		Short: "Import an upgrade bundle (a stick's partition or a file); stage its release",
		Example: `  kiln agent import /dev/sdb2              # an upgrade stick's bundle partition
  kiln agent import /tmp/upgrade.bundle    # a bundle file (kiln bundle --format file)`,
		Long: "Checks the bundle's signature against the keys in " + contract.TrustDir + " before using anything from it,\n" +
			"then that it is for this appliance and arch, newer than the running release (a delta: made for it),\n" +
			"that nothing else is staged and that /var has room; then copies its blobs into the release store and\n" +
			"stages the release for the next boot. A refusal changes nothing; an interrupted import is resumed by\n" +
			"running it again. A release that failed on this node before (rolled back since a release was last\n" +
			"confirmed) is refused, saying when and why, unless --retry-failed asks to try it once more.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := flags.machine(cmd)
			if err != nil {
				return err
			}
			opts := []bundleimport.Option{bundleimport.WithRoot(flags.root),
				bundleimport.WithLog(cmd.OutOrStdout()), bundleimport.WithMachine(m),
				bundleimport.WithImageStore(flags.openStore)}
			if retry {
				opts = append(opts, bundleimport.WithRetryFailed())
			}
			_, err = bundleimport.Import(cmd.Context(), args[0], opts...)
			return err
		},
	}
	flags.add(cmd)
	cmd.Flags().BoolVar(&retry, "retry-failed", false, "stage the release even though it failed on this node before")
	return cmd
}
