package main

import (
	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/systemd/agent/bundleimport"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func newImportCommand() *cobra.Command {
	var flags releaseFlags
	cmd := &cobra.Command{
		Use:   "import SOURCE",
		Short: "Import an upgrade bundle (a stick's partition or a file); stage its release",
		Example: `  kiln agent import /dev/sdb2              # an upgrade stick's bundle partition
  kiln agent import /tmp/upgrade.bundle    # a bundle file (kiln bundle --format file)`,
		Long: "Checks the bundle's signature against the keys in " + contract.TrustDir + " before using anything from it,\n" +
			"then that it is for this appliance and arch, newer than the running release (a delta: made for it),\n" +
			"that nothing else is staged and that /var has room; then copies its blobs into the release store and\n" +
			"stages the release for the next boot. A refusal changes nothing; an interrupted import is resumed by\n" +
			"running it again.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := flags.machine(cmd)
			if err != nil {
				return err
			}
			_, err = bundleimport.Import(cmd.Context(), args[0], bundleimport.WithRoot(flags.root),
				bundleimport.WithLog(cmd.OutOrStdout()), bundleimport.WithMachine(m),
				bundleimport.WithImageStore(flags.openStore))
			return err
		},
	}
	flags.add(cmd)
	return cmd
}
