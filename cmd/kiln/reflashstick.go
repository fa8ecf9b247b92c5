//go:build !nodeonly

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/reflashstick"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/version"
)

func init() { subcommands = append(subcommands, newReflashStickCommand) }

func newReflashStickCommand() *cobra.Command {
	var (
		o     reflashstick.Options
		fetch fetchFlags
	)
	cmd := &cobra.Command{
		Use:   "reflash-stick RECIPE [--disk DISK] -o STICK",
		Short: "Write a recovery stick image that reflashes a replaced disk",
		Example: `  kiln reflash-stick appliance.yaml -o reflash.img
  kiln reflash-stick appliance.yaml --disk disk.raw -o reflash.img   # a disk built before
  kiln reflash-stick appliance.yaml -o reflash.img --secure-boot-key secureboot/db.key   # a recipe with secureBoot`,
		Long: `Reflash-stick builds the appliance disk from RECIPE and its lock exactly as kiln build does (the
same bytes; the lock and the blob cache as kiln build uses them), or takes DISK, built before with
kiln build. It checks the disk as kiln verify does (it must be the disk built from RECIPE), then
writes STICK: the recipe's base OS, whose first boot runs kiln agent reflash on the console, and a
payload partition with DISK, its record (size, sha256, a sha256 per 4 MiB) and the node edition
of kiln. Booted, the stick picks the replacement disk (the recipe's reflash.target), shows it,
asks once (unless reflash.unattended or --unattended), checks its copy of DISK, writes it, reads
every byte back and powers off. For a recipe with secureBoot, the stick's boot files are signed
as the disk's are (--secure-boot-key, also with --disk): it boots with Secure Boot on, and enrols
the keys on a machine in setup mode. Put STICK on a stick with kiln write. STICK appears only when
complete; the disk built on the way is a temporary file beside it, removed at the end and on
any error. See docs/technician.md.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Output == "" {
				return usageError{fmt.Errorf("-o STICK is needed (usage: %s)", usageLine(cmd))}
			}
			if o.Disk != "" && (o.Build.CacheDir != "" || o.Build.RefreshLock || fetch.insecure) {
				return usageError{fmt.Errorf("--cache, --refresh-lock and --insecure-registries apply only when reflash-stick builds the disk: drop them, or drop --disk DISK")}
			}
			if err := needTools(cmd, diskTools); err != nil {
				return err
			}
			o.Progress = newProgress()
			o.Build.Fetch = fetch.options()
			o.Build.Log = cmd.ErrOrStderr()
			res, err := reflashstick.Write(cmd.Context(), args[0], o)
			if errors.Is(err, builder.ErrNoSecureBootKey) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			mode := "asks on the console before writing"
			if res.Record.Unattended {
				mode = "unattended: writes without asking"
			}
			disk := o.Disk
			if res.Built {
				disk = "the disk built from " + args[0]
			}
			c := res.About.Disk
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%s), carrying %s (%s %s, %s, %s); %s\nagent: %s, %s\n",
				res.Output, human.Bytes(res.Size), disk, c.Recipe, c.Version, human.Bytes(res.Record.Size), res.Record.SHA256, mode,
				res.About.Agent, human.Bytes(res.AgentSize))
			return nil
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "stick image to write (required)")
	cmd.Flags().StringVar(&o.Disk, "disk", "", "the appliance disk built from RECIPE (kiln build -o); default: build it now, as kiln build does")
	cmd.Flags().StringVar(&o.Build.CacheDir, "cache", "", "blob cache directory, when building the disk (default $XDG_CACHE_HOME/kiln)")
	cmd.Flags().BoolVar(&o.Build.RefreshLock, "refresh-lock", false, "re-resolve the recipe's tags and rewrite its lock file, when building the disk")
	cmd.Flags().StringVar(&o.SecureBootKey, "secure-boot-key", "", "the Secure Boot db private key (db.key from kiln key secureboot), for a recipe with secureBoot: it signs the stick's boot files, and the disk when reflash-stick builds it")
	cmd.Flags().BoolVar(&o.Unattended, "unattended", false, "write without asking on the console (default: the recipe's reflash.unattended)")
	cmd.Flags().StringVar(&o.Agent, "agent", "", "the node's kiln binary (kiln-agent, built with -tags nodeonly) for the recipe's arch (default: kiln-agent beside this binary, when the arches match)")
	fetch.register(cmd)
	return cmd
}

func printReflashStick(w io.Writer, rep *reflashstick.Report, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(w, "Reflash stick %s: %s, disk GUID %s\n", rep.Path, human.Bytes(rep.Layout.Size), rep.Layout.GUID)
	d := rep.Disk
	if c := d.Contents; c != nil {
		fmt.Fprintf(w, "Carries: appliance %s %s (%s), lock %s, %d image(s)\n", human.Quote(c.Recipe), human.Quote(c.Version), human.Quote(c.Arch), human.Quote(short(c.LockDigest)), len(c.Images))
		if c.Kiln != (version.Info{}) {
			fmt.Fprintf(w, "  built by %s\n", c.Kiln)
		}
	} else {
		fmt.Fprintln(w, "Carries: an appliance disk; which one is not recorded (a stick made before kiln recorded it)")
	}
	fmt.Fprintf(w, "  disk.raw: %s, %s, disk GUID %s\n", human.Bytes(d.Size), d.SHA256, d.DiskGUID)
	which := "kiln, version not recorded"
	if rep.Agent.Version != nil {
		which = rep.Agent.Version.String()
	}
	fmt.Fprintf(w, "Agent: %s, %s, %s\n", which, human.Bytes(rep.Agent.Size), short(rep.Agent.Digest))
	if rep.Kiln != nil {
		fmt.Fprintf(w, "Made by: %s\n", rep.Kiln)
	}
	ask := "asks on the console before writing"
	if rep.Unattended {
		ask = "unattended: writes without asking"
	}
	disk := rep.Target.String()
	if !rep.Target.IsZero() {
		disk = "the disk matching " + disk
	}
	fmt.Fprintf(w, "Writes: %s; %s\n", disk, ask)
	if rep.SecureBoot != nil {
		fmt.Fprintln(w, builder.SecureBootReadyLine(rep.SecureBoot))
	} else {
		fmt.Fprintln(w, "Secure Boot: not ready (boot loader entries, unsigned: made from a recipe without secureBoot, or by an older kiln)")
	}
	if c := d.Contents; c != nil {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "IMAGE\tDIGEST\tSIZE\tSERVED\tPRELOADED")
		for _, img := range c.Images {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", human.Quote(img.Name), human.Quote(short(img.Digest)), human.Bytes(img.Size), yesNo(img.Served), yesNo(img.Preloaded))
		}
		tw.Flush()
	}
	return nil
}
