package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.podman.io/storage"
	stypes "go.podman.io/storage/types"

	"github.com/kiln-appliance/kiln/systemd/agent/healthcheck"
	"github.com/kiln-appliance/kiln/systemd/agent/release"
	"github.com/kiln-appliance/kiln/systemd/agent/restore"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// releaseFlags are what every command on the release state shares.
type releaseFlags struct {
	root  string
	apply string
}

func (f *releaseFlags) add(cmd *cobra.Command) {
	f.addRoot(cmd)
	cmd.Flags().StringVar(&f.apply, "apply-pins", "reload", "how CRI-O is made to read new pins: reload, restart or none (no CRI-O)")
}

func (f *releaseFlags) addRoot(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.root, "root", "/", "the node's root (tests run on a tree of their own)")
	cmd.Flags().MarkHidden("root")
}

func (f *releaseFlags) machine(cmd *cobra.Command) (*release.Machine, error) {
	var a release.PinApplier
	switch f.apply {
	case "reload":
		a = release.ReloadCRIO
	case "restart":
		a = release.RestartCRIO
	case "none", "": // "": a command that never changes the pins (status)
		a = release.PinApplierFunc(func(context.Context) error { return nil })
	default:
		return nil, usageError{fmt.Errorf("--apply-pins %q: want reload, restart or none", f.apply)}
	}
	images := release.StorageImages{Log: cmd.OutOrStdout(), Open: f.openStore}
	return release.New(release.WithRoot(f.root), release.WithPinApplier(a), release.WithImageRemover(images),
		release.WithLog(cmd.OutOrStdout())), nil
}

// openStore opens the node's containers/storage (a test's tree: its own).
func (f *releaseFlags) openStore() (storage.Store, error) {
	return openNodeStore(func(opts *stypes.StoreOptions) {
		if f.root != "/" {
			opts.GraphRoot = filepath.Join(f.root, opts.GraphRoot)
			opts.RunRoot = filepath.Join(f.root, opts.RunRoot)
		}
	})
}

func newStatusCommand() *cobra.Command {
	var (
		flags  releaseFlags
		format string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the node's releases, its pins, its images and the last result",
		Example: `  kiln agent status
  kiln agent status --format json   # for monitoring`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "text" && format != "json" {
				return usageError{fmt.Errorf("--format %q: want text or json", format)}
			}
			m, err := flags.machine(cmd)
			if err != nil {
				return err
			}
			st, err := m.Status()
			if err != nil {
				return err
			}
			ns := nodeStatus{Status: st}
			ns.Images, ns.ImagesError = imagePresence(flags)
			if format == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(ns)
			}
			printStatus(cmd.OutOrStdout(), ns)
			return nil
		},
	}
	flags.addRoot(cmd)
	formatFlag(cmd, &format)
	return cmd
}

// nodeStatus is `kiln agent status`: the release state and what local
// storage holds of the images the node keeps.
type nodeStatus struct {
	*release.Status
	Images      *restore.Presence `json:"images,omitempty"`
	ImagesError string            `json:"imagesError,omitempty"` // why Images could not be read
}

// imagePresence reads local storage for the images the node must hold now.
func imagePresence(flags releaseFlags) (*restore.Presence, string) {
	images, _, err := keptImages(flags.root, filepath.Join(flags.root, contract.MountPoint))
	if err == nil {
		var p *restore.Presence
		if p, err = restore.Check(flags.openStore, images); err == nil {
			return p, ""
		}
	}
	return nil, err.Error()
}

func printStatus(w io.Writer, ns nodeStatus) {
	st := ns.Status
	line := func(label string, r *contract.Release, note string) {
		if r == nil {
			fmt.Fprintf(w, "%-9s -\n", label+":")
			return
		}
		fmt.Fprintf(w, "%-9s %s  (%d image(s), %d file(s))%s\n", label+":", r.Version, len(r.Images), len(r.Files), note)
	}
	note := ""
	if !st.Recorded {
		note = "  factory release; no state recorded yet"
	}
	line("current", &st.Current, note)
	line("previous", st.Previous, "  kept for rollback")
	line("staged", st.Staged, "  tried at the next boot")
	line("trying", st.Trying, fmt.Sprintf("  boot %d, waiting for its health check", st.Attempts))
	if st.Booted != "" && st.Current.OS != nil { // a node whose OS is in A/B slots
		fmt.Fprintf(w, "%-9s %s%s\n", "booted:", st.Booted, bootedRelease(st))
	}
	if len(st.Retired) > 0 {
		fmt.Fprintf(w, "%-9s %s (still being removed)\n", "retired:", strings.Join(st.Retired, ", "))
	}
	if l := st.Last; l != nil {
		ok := "ok"
		if !l.OK {
			ok = "FAILED"
		}
		msg := ""
		if l.Message != "" {
			msg = ": " + l.Message
		}
		fmt.Fprintf(w, "%-9s %s %s %s%s (%s)\n", "last:", l.Action, l.Version, ok, msg, time.Unix(l.Time, 0).UTC().Format(time.RFC3339))
	}
	// Kept until a release is confirmed: a re-staged release that failed
	// before is not mistaken for a fresh one.
	for _, f := range st.Failed {
		fmt.Fprintf(w, "%-9s %s rolled back at %s: %s\n", "failed:", f.Version, time.Unix(f.Time, 0).UTC().Format(time.RFC3339), f.Message)
	}
	match := "as the state says"
	switch {
	case !st.Recorded:
		match = "as Ignition wrote them (the state is recorded at the next boot)"
	case !st.PinsCurrent:
		match = "NOT as the state says: a change was interrupted; the next boot finishes it (or: kiln agent release converge)"
	}
	fmt.Fprintf(w, "%-9s %d in %s, %s\n", "pins:", len(st.Pins), contract.PinsDropIn, match)
	for _, p := range st.Pins {
		fmt.Fprintf(w, "  %s\n", p)
	}
	switch p := ns.Images; {
	case p == nil:
		fmt.Fprintf(w, "%-9s unknown: %s\n", "images:", ns.ImagesError)
	case len(p.Missing) == 0:
		fmt.Fprintf(w, "%-9s all %d image(s) the node keeps are in local storage\n", "images:", p.Kept)
	default:
		fmt.Fprintf(w, "%-9s MISSING %d of %d image(s) the node keeps from local storage (%s restores them at boot; journalctl -b -u %s says why it could not):\n",
			"images:", len(p.Missing), p.Kept, contract.RestoreUnit, contract.RestoreUnit)
		for _, im := range p.Missing {
			fmt.Fprintf(w, "  %s@%s\n", im.Name, im.Digest)
		}
	}
}

// bootedRelease names the release whose entry the boot loader booted.
func bootedRelease(st *release.Status) string {
	for _, r := range []*contract.Release{st.Trying, &st.Current, st.Previous, st.Staged} {
		if r != nil && r.OS != nil && r.OS.Entry == st.Booted {
			return fmt.Sprintf(" (release %s, slot %s)", r.Version, r.OS.Slot)
		}
	}
	return " (no release the node keeps)"
}

// newReleaseCommand holds the state machine's transitions as the upgrade
// boot's units and a technician run them. Importing a bundle (which stages)
// is `kiln agent import`.
func newReleaseCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Move the node between releases: try, confirm, roll back or abandon one",
		Example: `  kiln agent release abandon 1.1.0   # drop a staged release before it is tried
  kiln agent release converge        # finish an interrupted change`,
	}
	var flags releaseFlags
	var reason string
	sub := []*cobra.Command{
		{
			Use:     "begin [PARTITION]",
			Short:   "At boot, before CRI-O: record the factory release, try a staged one",
			Example: `  kiln agent release begin /var/lib/kiln/images`,
			Long: "Records the image partition's release (PARTITION/kiln.json, default " + contract.MountPoint + ") as current when the\n" +
				"node has no release state, then begins trying a staged release (its files installed, its images pinned),\n" +
				"or rolls back one that was not confirmed after 3 boots. Every boot may run it; it also finishes any\n" +
				"interrupted change.",
			Args: optionalPartitionArg,
			RunE: func(cmd *cobra.Command, args []string) error {
				m, err := flags.machine(cmd)
				if err != nil {
					return err
				}
				part := filepath.Join(flags.root, contract.MountPoint)
				if len(args) == 1 {
					part = args[0]
				}
				c, err := contract.Read(part)
				if err != nil {
					return err
				}
				if _, err := m.Init(cmd.Context(), release.FactoryRelease(c)); err != nil {
					return err
				}
				_, err = m.Begin(cmd.Context())
				return err
			},
		},
		{
			Use:     "confirm VERSION",
			Short:   "Make the release being tried current (the current one becomes previous)",
			Example: `  kiln agent release confirm 1.1.0`,
			Args:    exactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				m, err := flags.machine(cmd)
				if err != nil {
					return err
				}
				_, err = m.Confirm(cmd.Context(), args[0])
				return err
			},
		},
		{
			Use:     "rollback VERSION --reason TEXT",
			Short:   "The release being tried failed its health check: put the current release back",
			Example: `  kiln agent release rollback 1.1.0 --reason "the app does not answer"`,
			Args:    exactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				m, err := flags.machine(cmd)
				if err != nil {
					return err
				}
				_, err = m.Rollback(cmd.Context(), args[0], reason)
				return err
			},
		},
		{
			Use:     "abandon VERSION",
			Short:   "Drop the staged release before it is tried",
			Example: `  kiln agent release abandon 1.1.0`,
			Args:    exactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				m, err := flags.machine(cmd)
				if err != nil {
					return err
				}
				_, err = m.Abandon(cmd.Context(), args[0])
				return err
			},
		},
		{
			Use:     "converge",
			Short:   "Make pins, release files and store match the state (finish a change)",
			Example: `  kiln agent release converge`,
			Args:    exactArgs(0),
			RunE: func(cmd *cobra.Command, args []string) error {
				m, err := flags.machine(cmd)
				if err != nil {
					return err
				}
				_, err = m.Converge(cmd.Context())
				return err
			},
		},
	}
	sub = append(sub, newReleaseCheckCommand(&flags))
	for _, c := range sub {
		flags.add(c)
		cmd.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newReleaseTryingCommand(&flags), newReleaseConfirmedCommand(&flags)} {
		flags.addRoot(c)
		cmd.AddCommand(c)
	}
	sub[2].Flags().StringVar(&reason, "reason", "health check failed", "what failed, for kiln agent status")
	return cmd
}

// newReleaseTryingCommand answers whether a release is being tried, as an
// exit code: the ExecCondition= of the units that run only on an upgrade
// boot (the registry serving it, the health check).
func newReleaseTryingCommand(flags *releaseFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "trying",
		Short:   "Exit 0 when a release is being tried, 1 when none is, 255 on a bad state file",
		Example: `  kiln agent release trying   # as a unit's ExecCondition=`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := release.New(release.WithRoot(flags.root)).Load()
			switch {
			case errors.Is(err, os.ErrNotExist):
				return exitCodeError{1, errors.New("no release state recorded: no release is being tried")}
			case err != nil:
				return exitCodeError{255, err}
			case st.Trying == nil:
				return exitCodeError{1, fmt.Errorf("no release is being tried (current: %s)", st.Current.Version)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "release %s is being tried (boot %d)\n", st.Trying.Version, st.Attempts)
			return nil
		},
	}
}

// newReleaseConfirmedCommand answers, as an exit code, whether the boot
// loader may bless this boot's entry: kiln-release-good.service, which
// boot-complete.target requires on a counted boot.
func newReleaseConfirmedCommand(flags *releaseFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "confirmed",
		Short:   "Exit 0 when this boot's entry is the current, confirmed release's, else 1",
		Example: `  kiln agent release confirmed   # before the boot loader marks the entry good`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := release.New(release.WithRoot(flags.root)).Confirmed()
			if err != nil {
				return fmt.Errorf("%w: this boot's entry is not marked good; the boot loader counts its tries down and goes back to the release before when they run out", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "release %s (entry %s) is confirmed: the boot loader may mark its entry good\n", r.Version, r.OS.Entry)
			return nil
		},
	}
}

// newReleaseCheckCommand is the upgrade boot's last step: the recipe's
// health check decides whether the release being tried is confirmed or
// rolled back.
func newReleaseCheckCommand(flags *releaseFlags) *cobra.Command {
	var spec healthcheck.Spec
	cmd := &cobra.Command{
		Use:   "check [--unit UNIT]… [--timeout D] [--unhealthy-exit-code N] [-- COMMAND [ARG…]]",
		Short: "Health-check the release being tried: confirm it, or roll it back and exit 1",
		Example: `  kiln agent release check --timeout 5m
  kiln agent release check --timeout 90s --unit crio.service -- /usr/bin/curl -fsS http://127.0.0.1:8080/healthz
  kiln agent release check --timeout 5m --unhealthy-exit-code 3 -- /etc/kiln/release/health`,
		Long: "With a release being tried, waits until every --unit is active and COMMAND (if given) exits 0, then\n" +
			"confirms the release; at --timeout it rolls the release back, says what failed and exits 1 (the unit\n" +
			"then reboots into the previous release). A COMMAND that exits with --unhealthy-exit-code says the\n" +
			"release is broken for good: it is rolled back at once. With nothing being tried it does nothing.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if spec.Timeout <= 0 {
				return usageError{fmt.Errorf("--timeout %s: want a positive duration, e.g. 5m", spec.Timeout)}
			}
			if c := spec.UnhealthyExitCode; c < 0 || c > 255 || (c > 0 && len(args) == 0) {
				return usageError{fmt.Errorf("--unhealthy-exit-code %d: want an exit status from 1 to 255, with a COMMAND", c)}
			}
			spec.Command = args
			m, err := flags.machine(cmd)
			if err != nil {
				return err
			}
			st, err := m.Load()
			if errors.Is(err, os.ErrNotExist) { // nothing recorded: nothing imported either
				st, err = &state.State{}, nil
			}
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if st.Trying == nil {
				fmt.Fprintln(w, "health check: no release is being tried; nothing to do")
				return nil
			}
			v := st.Trying.Version
			var what []string // as the technician reads it: no empty command
			if len(spec.Units) > 0 {
				what = append(what, strings.Join(spec.Units, ", ")+" active")
			}
			if len(args) > 0 {
				exits := fmt.Sprintf("%q exits 0", strings.Join(args, " "))
				if c := spec.UnhealthyExitCode; c > 0 {
					exits += fmt.Sprintf(" (exit %d: unhealthy for good, roll back at once)", c)
				}
				what = append(what, exits)
			}
			if len(what) == 0 {
				what = []string{"nothing to wait for"}
			}
			fmt.Fprintf(w, "health check of release %s: %s, within %s\n", v, strings.Join(what, " and "), spec.Timeout)
			if herr := healthcheck.Run(cmd.Context(), spec, nil); herr != nil {
				if _, err := m.Rollback(cmd.Context(), v, herr.Error()); err != nil {
					return fmt.Errorf("release %s failed its %v, and the rollback failed: %w", v, herr, err)
				}
				return fmt.Errorf("release %s failed its %v; rolled back to %s", v, herr, st.Current.Version)
			}
			if _, err := m.Confirm(cmd.Context(), v); err != nil {
				return err
			}
			fmt.Fprintf(w, "release %s passed its health check and is now current\n", v)
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&spec.Units, "unit", nil, "a unit that must be active (repeatable)")
	cmd.Flags().DurationVar(&spec.Timeout, "timeout", 5*time.Minute, "how long the release has to become healthy")
	cmd.Flags().IntVar(&spec.UnhealthyExitCode, "unhealthy-exit-code", 0, "COMMAND's exit status for \"broken for good\": roll back at once, not at --timeout (0: none)")
	return cmd
}
