//go:build !nodeonly

package main

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

func init() { subcommands = append(subcommands, newBundleCommand) }

func newBundleCommand() *cobra.Command {
	var (
		o     bundle.Options
		fetch fetchFlags
	)
	cmd := &cobra.Command{
		Use:   "bundle RECIPE -o OUTPUT --key NAME.key [--from RELEASE]...",
		Short: "Write a signed field upgrade bundle for a USB stick (or a single file)",
		Example: `  kiln bundle appliance.yaml -o upgrade.img --key factory.key                          # full
  kiln bundle appliance.yaml -o upgrade.img --key factory.key --from disk-1.0.raw     # delta
  kiln bundle appliance.yaml -o upgrade.bundle --key factory.key --format file`,
		Long: `Bundle writes the release described by RECIPE and its lock as a signed upgrade bundle: by default
a raw image for a USB stick (dd it, or use any USB writer), with --format file a single file to
copy to the node. --from names what the appliances run (a previous lock with its recipe beside it,
a disk kiln built, its kiln.json, or a previous bundle; repeat it for several): the bundle then
carries only the blobs none of them holds and applies only to those releases. Without --from it is
a full bundle that applies to any earlier release. See docs/bundles.md.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Output == "" || o.Key == "" {
				return usageError{fmt.Errorf("both -o OUTPUT and --key NAME.key are needed (usage: %s)", usageLine(cmd))}
			}
			if o.Format != bundle.FormatImage && o.Format != bundle.FormatFile {
				return usageError{fmt.Errorf("--format %q: want image or file", o.Format)}
			}
			if err := needTools(cmd, bundleTools); err != nil {
				return err
			}
			o.Fetch = fetch.options()
			o.Log = cmd.ErrOrStderr()
			o.Progress = newProgress()
			res, err := bundle.Write(cmd.Context(), args[0], o)
			if errors.Is(err, builder.ErrNoSecureBootKey) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			m := res.Manifest
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%s %s %s bundle, %s; %s of blobs; signed by %s)\nagent: %s\n",
				res.Output, m.Recipe, m.Version, m.Kind, human.Bytes(res.Size), human.Bytes(m.Space.CopyBytes), res.KeyID,
				agentLine(res.Agent, m.Agent, m.AgentOnStick))
			if m.OS != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s\n%s\n", osLine(m), bootLine(m.OS))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "bundle to write (required)")
	cmd.Flags().StringVar(&o.Format, "format", bundle.FormatImage, "image (a USB stick image) or file (a single file)")
	cmd.Flags().StringArrayVar(&o.From, "from", nil, "a release the appliances run: lock, disk, kiln.json or bundle (repeatable); none: a full bundle")
	cmd.Flags().StringVar(&o.Key, "key", "", "private key to sign with (NAME.key from kiln key generate; required)")
	cmd.Flags().StringVar(&o.SecureBootKey, "secure-boot-key", "", "the Secure Boot db private key (db.key from kiln key secureboot) that signs the release's unified kernel images, for a recipe with secureBoot")
	cmd.Flags().StringVar(&o.CacheDir, "cache", "", "blob cache directory (default $XDG_CACHE_HOME/kiln)")
	cmd.Flags().StringVar(&o.Agent, "agent", "", "the node's kiln binary (kiln-agent, built with -tags nodeonly) for the recipe's arch (default: kiln-agent beside this binary, when the arches match)")
	fetch.register(cmd)
	return cmd
}

// readKeys reads the public keys given with --key.
func readKeys(paths []string) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for _, p := range paths {
		data, err := inputfile.ReadFile(p, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("--key: %w", err)
		}
		k, err := bundlefmt.ParsePublicKey(data)
		if err != nil {
			return nil, fmt.Errorf("--key %s: %w", p, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func printBundle(w io.Writer, rep *bundle.Report, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	m := rep.Manifest
	fmt.Fprintf(w, "Bundle %s: %s %s (%s), %s bundle, %s, %s\n", rep.Path, human.Quote(m.Recipe), human.Quote(m.Version), human.Quote(m.Arch), human.Quote(m.Kind), formatName(rep.Format), human.Bytes(rep.Size))
	if m.Kind == bundlefmt.KindFull {
		fmt.Fprintln(w, "Applies to: any earlier release")
	} else {
		for _, r := range m.AppliesTo {
			fmt.Fprintf(w, "Applies to: %s (lock %s)\n", human.Quote(r.Version), human.Quote(short(r.LockDigest)))
		}
	}
	signed := rep.Verified
	if signed == "" {
		signed = human.Quote(fmt.Sprint(rep.SignedBy)) + " (claimed; kiln verify --key checks it)"
	}
	fmt.Fprintf(w, "Signed by: %s\n", signed)
	if m.Kiln != (version.Info{}) {
		fmt.Fprintf(w, "Made by: %s\n", m.Kiln)
	} else {
		fmt.Fprintf(w, "Made by: not recorded (manifest schema %d)\n", m.SchemaVersion)
	}
	fmt.Fprintf(w, "Agent: %s\n", agentLine(m.AgentVersion, m.Agent, m.AgentOnStick))
	if m.OS != nil {
		fmt.Fprintf(w, "%s\n%s\n", osLine(m), bootLine(m.OS))
	}
	fmt.Fprintf(w, "Space on the node: %s of blobs to copy, %s unpacked\n\n", human.Bytes(m.Space.CopyBytes), human.Bytes(m.Space.UnpackedBytes))
	onStick := map[string]bool{}
	for _, b := range m.Blobs {
		onStick[b.Digest] = b.OnStick
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tDIGEST\tSIZE\tSERVED\tPRELOADED\tBLOBS ON STICK")
	for _, img := range m.Images {
		n := 0
		for _, d := range append([]string{img.Digest}, img.Blobs...) {
			if onStick[d] {
				n++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d of %d\n", human.Quote(img.Name), human.Quote(short(img.Digest)), human.Bytes(img.Size), yesNo(img.Served), yesNo(img.Preloaded), n, len(img.Blobs)+1)
	}
	tw.Flush()
	printRelease(w, m.ReleaseFiles, m.Trust, "after this release")
	return nil
}

// printRelease lists a release's files and the keys its nodes trust, under
// a disk's or a bundle's images; when says when they trust them.
func printRelease(w io.Writer, files []contract.ReleaseFile, trust []contract.TrustKey, when string) {
	if len(files) > 0 {
		fmt.Fprintln(w, "\nRelease files:")
		for _, f := range files {
			size := human.Bytes(f.Size)
			if f.Digest == "" {
				size = "fetched by Ignition"
			}
			fmt.Fprintf(w, "  %s (%04o, %s)\n", human.Quote(f.Path), f.Mode, size)
		}
	}
	if len(trust) == 0 {
		fmt.Fprintln(w, "\nTrusted keys: none (its nodes accept no upgrade bundle; a recipe lists keys under trust)")
		return
	}
	fmt.Fprintf(w, "\nTrusted keys %s:\n", when)
	for _, k := range trust {
		fmt.Fprintf(w, "  %s\n", human.Quote(k.KeyID))
	}
}

func formatName(f string) string {
	if f == bundle.FormatImage {
		return "stick image"
	}
	return "single file"
}

// agentLine says which agent a release runs and whether the stick carries
// it: "kiln-agent v1.2.0 (…, node edition), 11.2 MiB, on the stick".
func agentLine(v version.Info, f bundlefmt.File, onStick bool) string {
	which := v.String()
	if v == (version.Info{}) {
		which = "kiln " + short(f.Digest) + ", version not recorded (manifest schema 1)"
	}
	where := "on the stick"
	if !onStick {
		where = "not on the stick: every node it applies to runs this very agent, and keeps it"
	}
	return fmt.Sprintf("%s, %s, %s", which, human.Bytes(f.Size), where)
}

// osLine says what the bundle carries of the release's OS slot: "OS: usr
// slot 180.0 MiB (root hash 3f2a9c1b4d5e…), 12.3 MiB of its chunks on the
// stick".
func osLine(m *bundlefmt.Manifest) string {
	u := m.OS.Usr
	pack := "none of its chunks on the stick: every node it applies to holds them all"
	if u.Pack != nil {
		pack = human.Bytes(u.Pack.Size) + " of its chunks on the stick"
		if m.Kind == bundlefmt.KindDelta {
			pack += ", the rest from the node's active slot"
		}
	}
	return fmt.Sprintf("OS: usr slot %s (root hash %s…), %s", human.Bytes(u.Size), u.Verity.RootHash[:min(12, len(u.Verity.RootHash))], pack)
}

// bootLine says which boot entry the release installs and whether its
// kernel and initramfs are on the stick.
func bootLine(o *bundlefmt.OS) string {
	e := o.Entry
	file := func(what string, f bundlefmt.BootFile) string {
		where := "on the stick"
		if !f.OnStick {
			where = "the node's own"
		}
		return fmt.Sprintf("%s %s %s (%s)", what, human.Quote(f.Name), human.Bytes(f.Size), where)
	}
	s := fmt.Sprintf("Boot entry: version %s, %s", human.Quote(e.Version), file("kernel", e.Kernel))
	for _, f := range e.Initrd {
		s += ", " + file("initramfs", f)
	}
	if len(o.UKIs) > 0 {
		// A Secure Boot release: "Signed images: slot a, slot b for image
		// partition 5d1f…; ..." (the stick's strings quoted).
		var parts []string
		for _, u := range o.UKIs {
			h := u.ImagesRootHash
			if len(h) > 12 {
				h = h[:12] + "…"
			}
			parts = append(parts, fmt.Sprintf("slot %s %s for image partition %s", human.Quote(u.Slot), human.Bytes(u.Size), human.Quote(h)))
		}
		s += "\nSigned images (Secure Boot): " + strings.Join(parts, ", ")
	}
	return s
}
