//go:build !nodeonly

package main

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/builder/reflashstick"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

func init() { subcommands = append(subcommands, newInspectCommand, newVerifyCommand) }

func newInspectCommand() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "inspect DISK|BUNDLE|STICK",
		Short: "Show what a disk, an upgrade bundle or a reflash stick holds",
		Long: `Inspect shows a disk image's partitions, OS slots, images, release files and trusted keys;
an upgrade bundle's release, whom it is for, its images, release files and the keys trusted
after it; or what a reflash stick carries. --format json prints the same for machines.`,
		Example: `  kiln inspect disk.raw
  kiln inspect upgrade.img
  kiln inspect --format json disk.raw`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "text" && format != "json" {
				return usageError{fmt.Errorf("--format %q: want text or json", format)}
			}
			id, err := identify(args[0])
			switch {
			case err != nil:
				return err
			case id.kind == notKiln:
				return id.notKilnError(args[0])
			case id.kind == bundleImage:
				rep, err := bundle.Inspect(args[0])
				if err != nil {
					return err
				}
				return printBundle(cmd.OutOrStdout(), rep, format)
			case id.kind == reflashStick:
				rep, err := reflashstick.Inspect(args[0])
				if err != nil {
					return err
				}
				return printReflashStick(cmd.OutOrStdout(), rep, format)
			}
			if err := needTools(cmd, slotTools); err != nil {
				return err
			}
			rep, err := builder.Inspect(args[0])
			if err != nil {
				return err
			}
			return printDisk(cmd.OutOrStdout(), rep, format)
		},
	}
	formatFlag(cmd, &format)
	return cmd
}

func newVerifyCommand() *cobra.Command {
	var o builder.VerifyOptions
	var keys []string
	cmd := &cobra.Command{
		Use:   "verify DISK|BUNDLE|STICK [--key NAME.pub]...",
		Short: "Check that a disk, a bundle or a reflash stick is exactly what kiln wrote",
		Long: `Verify checks that a disk holds exactly the bytes kiln wrote (both GPTs, every partition, the
image partition through dm-verity, every file against kiln.json); with --key, also that the disk
trusts each key (its nodes accept bundles signed with it). Of an upgrade bundle it checks the
signature against --key and re-hashes every blob; of a reflash stick, the disk it carries.`,
		Example: `  kiln verify disk.raw
  kiln verify disk.raw --key factory.pub      # and: its nodes accept bundles factory.key signs
  kiln verify upgrade.img --key factory.pub   # signature, every blob re-hashed
  kiln verify --booted /dev/sdX               # a disk taken out of a node that ran`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := identify(args[0])
			switch {
			case err != nil:
				return err
			case id.kind == notKiln || id.kind == otherDisk:
				return id.notKilnError(args[0])
			case id.kind == bundleImage:
				if len(keys) == 0 {
					return usageError{fmt.Errorf("%s is an upgrade bundle: give the public key(s) to check its signature with --key NAME.pub", args[0])}
				}
				pubs, err := readKeys(keys)
				if err != nil {
					return err
				}
				rep, err := bundle.Verify(cmd.Context(), args[0], pubs, newProgress())
				if err != nil {
					return err
				}
				m := rep.Manifest
				fmt.Fprintf(cmd.OutOrStdout(), "%s: OK (%s %s %s bundle signed by %s, %d files, %d images verified)\n", args[0], m.Recipe, m.Version, m.Kind, rep.Verified, len(m.Files), len(m.Images))
				return nil
			case id.kind == reflashStick:
				if len(keys) > 0 {
					return usageError{fmt.Errorf("%s is a reflash stick, which nothing signs: drop --key (kiln verify DISK --key checks the keys a disk trusts)", args[0])}
				}
				return verifyReflashStick(cmd, args[0])
			}
			pubs, err := readKeys(keys) // before the long read: a wrong --key fails at once
			if err != nil {
				return err
			}
			if o.Booted {
				if err := needTools(cmd, slotTools); err != nil {
					return err
				}
			}
			rep, err := builder.Verify(cmd.Context(), args[0], o, newProgress())
			if err != nil {
				return err
			}
			trusted, err := checkTrusted(args[0], keys, pubs, rep.Trust)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			v := rep.Verified
			fmt.Fprintf(w, "%s: checked against the build's seal (disk GUID %s):\n", args[0], rep.Layout.GUID)
			checked := append(v.Checked, fmt.Sprintf("%d files, %d images against kiln.json", len(rep.Contents.Files), len(rep.Contents.Images)))
			checked = append(checked, trusted...)
			printChecks(w, args[0], checked, v.Unchecked, "exactly the bytes the build wrote")
			return nil
		},
	}
	cmd.Flags().BoolVar(&o.Booted, "booted", false, "the disk has booted on a node: skip boot, root and the GPT headers, which the node changes; check the OS slots and ESP an upgrade rewrote by what the node wrote (dm-verity against each boot entry's root hash)")
	cmd.Flags().StringArrayVar(&keys, "key", nil, "public key a bundle must be signed with, or a disk must trust (NAME.pub; repeatable)")
	return cmd
}

// checkTrusted says, for each key given to verify a disk with, that the
// disk trusts it (its nodes accept bundles it signs), or fails naming the
// keys the disk does trust.
func checkTrusted(disk string, paths []string, pubs []ed25519.PublicKey, trust []contract.TrustKey) ([]string, error) {
	var ok []string
	for i, pub := range pubs {
		id, err := bundlefmt.KeyID(pub)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(trust, func(k contract.TrustKey) bool { return k.KeyID == id }) {
			ok = append(ok, fmt.Sprintf("%s (key ID %s) is trusted: the disk's nodes accept bundles signed with it", paths[i], id))
			continue
		}
		var ids []string
		for _, k := range trust {
			ids = append(ids, k.KeyID)
		}
		has := "it trusts none (its recipe lists no trust)"
		if len(ids) > 0 {
			has = "it trusts " + strings.Join(ids, ", ")
		}
		return nil, fmt.Errorf("%s holds the bytes the build wrote, but does not trust %s (key ID %s): its nodes would refuse bundles signed with it; %s", disk, paths[i], id, has)
	}
	return ok, nil
}

// printChecks lists what verify checked and what it could not, then says
// OK: with exactly when everything was checked, else with the exception.
func printChecks(w io.Writer, path string, checked, unchecked []string, exactly string) {
	for _, c := range checked {
		fmt.Fprintf(w, "  ok           %s\n", c)
	}
	for _, u := range unchecked {
		fmt.Fprintf(w, "  not checked  %s\n", u)
	}
	if len(unchecked) > 0 {
		fmt.Fprintf(w, "%s: OK, except what is not checked above\n", path)
	} else {
		fmt.Fprintf(w, "%s: OK (%s)\n", path, exactly)
	}
}

func printDisk(w io.Writer, rep *builder.Report, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReport(w, rep)
	return nil
}

// osSlotsLine says in one line whether the disk's OS can be upgraded, and
// where.
func osSlotsLine(rep *builder.Report) string {
	s := rep.OSSlots
	switch {
	case rep.OSSlotsError != "":
		return "OS slots: unusable, a build from this base is refused: " + rep.OSSlotsError
	case s == nil:
		return "OS upgrades: none (the base has no A/B slots; a release changes images and files only)"
	}
	var says [2]string
	for i, sl := range s.Slots {
		switch {
		case sl.Name == s.Active:
			says[i] = fmt.Sprintf("%s (active, entry %s, root hash %s…)", human.Quote(sl.Usr.Name), human.Quote(s.Entry), human.Quote(s.RootHash[:min(12, len(s.RootHash))]))
		case slotFilesystem(rep, sl) == "":
			says[i] = sl.Usr.Name + " (empty)"
		default:
			says[i] = fmt.Sprintf("%s (inactive, %s)", human.Quote(sl.Usr.Name), slotFilesystem(rep, sl))
		}
	}
	a, b := s.Slots[0].Usr.Size, s.Slots[1].Usr.Size
	if a == b {
		return fmt.Sprintf("OS slots: %s and %s, %s each", says[0], says[1], human.Bytes(a))
	}
	return fmt.Sprintf("OS slots: %s, %s and %s, %s", says[0], human.Bytes(a), says[1], human.Bytes(b))
}

// slotFilesystem is what the disk's partition table says the slot's usr
// partition holds ("" for nothing kiln recognises, e.g. zeros).
func slotFilesystem(rep *builder.Report, sl contract.OSSlot) string {
	for _, p := range rep.Layout.Partitions {
		if strings.EqualFold(p.GUID, sl.Usr.PartUUID) {
			return p.Filesystem
		}
	}
	return ""
}

func printReport(w io.Writer, rep *builder.Report) {
	l := rep.Layout
	fmt.Fprintf(w, "Disk %s: %s, GPT, disk GUID %s\n\n", rep.Disk, human.Bytes(l.Size), l.GUID)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tNAME\tSTART\tSIZE\tFS\tLABEL\tPARTITION GUID")
	for _, p := range l.Partitions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Number, human.Quote(p.Name), human.Bytes(p.Offset), human.Bytes(p.Size), human.Quote(p.Filesystem), human.Quote(p.Label), p.GUID)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%s\n", osSlotsLine(rep))
	fmt.Fprintln(w, builder.SecureBootLine(rep))
	c := rep.Contents
	if c == nil {
		fmt.Fprintln(w, "\nNo kiln image partition.")
		return
	}
	fmt.Fprintf(w, "\nAppliance %s %s (%s), lock %s\n", human.Quote(c.Recipe), human.Quote(c.Version), human.Quote(c.Arch), human.Quote(short(c.LockDigest)))
	if c.Kiln != (version.Info{}) {
		fmt.Fprintf(w, "Built by %s\n", c.Kiln)
	}
	var parts []string
	for k := range rep.Sizes {
		parts = append(parts, k)
	}
	sort.Strings(parts)
	for _, k := range parts {
		fmt.Fprintf(w, "  %-8s %s\n", k+"/", human.Bytes(rep.Sizes[k]))
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tDIGEST\tSIZE\tSERVED\tPRELOADED")
	for _, img := range c.Images {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", human.Quote(img.Name), human.Quote(short(img.Digest)), human.Bytes(img.Size), yesNo(img.Served), yesNo(img.Preloaded))
	}
	tw.Flush()
	printRelease(w, rep.ReleaseFiles, rep.Trust, "(its nodes accept upgrade bundles signed with these)")
}

func short(d string) string {
	if hex, ok := strings.CutPrefix(d, "sha256:"); ok && len(hex) > 12 {
		return "sha256:" + hex[:12]
	}
	return d
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}
