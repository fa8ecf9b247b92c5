//go:build !nodeonly

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/builder/reflashstick"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func init() { subcommands = append(subcommands, newReflashStickCommand) }

func newReflashStickCommand() *cobra.Command {
	var o reflashstick.Options
	cmd := &cobra.Command{
		Use:   "reflash-stick RECIPE --disk DISK -o STICK",
		Short: "Write a recovery stick image that reflashes a replaced disk with the appliance disk, proven by reading it back",
		Long: `Reflash-stick checks DISK as kiln verify does (it must be the disk built from RECIPE), then writes
STICK: the recipe's base OS, whose first boot runs kiln agent reflash on the console, and a
payload partition with DISK, its record (size, sha256, a sha256 per 4 MiB) and the node edition
of kiln. Booted, the stick picks the replacement disk (the recipe's reflash.target), shows it,
asks once (unless reflash.unattended or --unattended), checks its copy of DISK, writes it, reads
every byte back and powers off. Put STICK on a stick with kiln write. See docs/technician.md.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Output == "" || o.Disk == "" {
				return usageError{fmt.Errorf("both --disk DISK and -o STICK are needed (usage: kiln %s)", cmd.Use)}
			}
			o.Progress = newProgress()
			res, err := reflashstick.Write(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			mode := "asks on the console before writing"
			if res.Record.Unattended {
				mode = "unattended: writes without asking"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%s), carrying %s (%s, %s); %s\n",
				res.Output, contract.Bytes(res.Size), o.Disk, contract.Bytes(res.Record.Size), res.Record.SHA256, mode)
			return nil
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "stick image to write (required)")
	cmd.Flags().StringVar(&o.Disk, "disk", "", "the appliance disk built from RECIPE (kiln build -o; required)")
	cmd.Flags().BoolVar(&o.Unattended, "unattended", false, "write without asking on the console (default: the recipe's reflash.unattended)")
	cmd.Flags().StringVar(&o.Agent, "agent", "", "kiln binary for the node's arch (default: kiln-agent beside this binary, else this binary)")
	return cmd
}
