package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/systemd/agent/reflash"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

func newReflashCommand() *cobra.Command {
	var (
		unattended, noPowerOff bool
		candidates             []string
		target                 recovery.Target
	)
	cmd := &cobra.Command{
		Use:   "reflash [PAYLOAD]",
		Short: "Write a reflash stick's appliance disk to the replacement disk; read it back",
		Example: `  kiln agent reflash /run/kiln/reflash
  kiln agent reflash --unattended /run/kiln/reflash`,
		Long: `Run by the reflash stick's unit on the console. PAYLOAD is the stick's mounted payload partition
(default ` + recovery.MountPoint + `). Picks the target disk by the stick's rule (default: the one
non-removable disk that is neither the stick nor mounted), refusing when none or several fit, or
when it is smaller than the appliance disk; shows it and asks once (unless unattended); writes the
stick's disk image, each 4 MiB checked against its record just before, and reads every 64 MiB back
from the disk (flushed, O_DIRECT) while the next is written, the partition table last; says
"done — remove the stick and power on" and powers off.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			payload := recovery.MountPoint
			if len(args) == 1 {
				payload = args[0]
			}
			opts := []reflash.Option{reflash.WithConsole(cmd.InOrStdin(), cmd.OutOrStdout())}
			if unattended {
				opts = append(opts, reflash.WithUnattended())
			}
			if noPowerOff {
				opts = append(opts, reflash.WithPowerOff(nil))
			}
			if len(candidates) > 0 {
				opts = append(opts, reflash.WithCandidates(candidates...))
			}
			if !target.IsZero() {
				opts = append(opts, reflash.WithTarget(target))
			}
			if err := reflash.Run(cmd.Context(), payload, opts...); err != nil {
				return fmt.Errorf("reflash FAILED: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&unattended, "unattended", false, "do not ask on the console (the stick's record may also say so)")
	cmd.Flags().BoolVar(&noPowerOff, "no-poweroff", false, "stay up after success (tests)")
	cmd.Flags().StringArrayVar(&candidates, "candidate", nil, "consider only this disk (repeatable; loop devices, which are otherwise skipped)")
	cmd.Flags().StringVar(&target.Path, "target", "", "glob of the disk to write, e.g. /dev/disk/by-path/pci-*-ata-1 (replaces the stick's rule)")
	return cmd
}
