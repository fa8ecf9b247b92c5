// Command kiln builds immutable appliance disk images and runs the on-node
// agent that serves and pins their container images.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"go.podman.io/storage/pkg/reexec"

	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/agent/handoff"
)

// Exit codes: 1 for any failure, 2 for bad usage, 130 when interrupted.
const (
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// usageError marks errors in how kiln was called (exit code 2).
type usageError struct{ error }

// exitCodeError exits with its own code (systemd's ExecCondition= reads
// 1 as "skip the unit" and 255 as "fail it").
type exitCodeError struct {
	code int
	error
}

func main() {
	// containers/storage unpacks layers in a re-executed copy of this binary
	// (chrootarchive); that child must run its job, not the CLI.
	if reexec.Init() {
		return
	}
	// containers/storage logs its routine steps ("using prior storage
	// driver") at info level: noise on a technician's console. Its
	// warnings and errors still show.
	logrus.SetLevel(logrus.WarnLevel)
	// On the node: the agent of the release the boot loader booted runs,
	// not necessarily this one (the image partition's).
	if err := handoff.Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "kiln: %v\n", err)
		os.Exit(exitFailure)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	root := newRootCommand()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return
	}
	interrupted := ctx.Err() != nil || errors.Is(err, context.Canceled)
	fmt.Fprintf(os.Stderr, "kiln: %s\n", errorMessage(err, interrupted))
	var ue usageError
	var ce exitCodeError
	switch {
	case interrupted:
		os.Exit(exitInterrupted)
	case errors.As(err, &ue):
		os.Exit(exitUsage)
	case errors.As(err, &ce):
		os.Exit(ce.code)
	default:
		os.Exit(exitFailure)
	}
}

// errorMessage is err as the user reads it. When interrupted (Ctrl-C,
// SIGTERM), Go's "context canceled", wherever the chain wraps it, reads
// "interrupted", and an error that does not say why (a tool killed by the
// same signal) is marked so.
func errorMessage(err error, interrupted bool) string {
	msg := err.Error()
	if !interrupted {
		return msg
	}
	msg = strings.ReplaceAll(msg, context.Canceled.Error(), "interrupted")
	if !strings.Contains(msg, "interrupted") {
		msg = "interrupted: " + msg
	}
	return msg
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "kiln",
		Short: "Build immutable appliance disk images with their container images inside",
		Example: `  kiln lock appliance.yaml                # resolve every tag to a digest: appliance.lock
  kiln build appliance.yaml -o disk.raw   # the disk image (uses the lock; writes one if missing)
  kiln inspect disk.raw                   # what it holds
  kiln verify disk.raw                    # exactly the bytes the build wrote
  kiln write disk.raw /dev/sdX            # onto a removable stick, read back
  kiln key generate factory               # the key pair that signs upgrade bundles
  kiln bundle appliance.yaml -o upgrade.img --key factory.key --from disk-1.0.raw`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// cobra's shell completion still runs, unlisted: kiln documents no
	// completion, and its help would be the one without an example.
	root.CompletionOptions.HiddenDefaultCmd = true
	if version.Current().Edition == version.Node { // serve and agent only
		root.Example = `  kiln agent status                 # the node's releases, pins and images
  kiln serve /var/lib/kiln/images   # the read-only registry (run by systemd)
  kiln --version`
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// --version by hand: cobra's own runs a text/template, which costs the
	// node edition 3 MiB (reflection keeps every exported method).
	var showVersion bool
	root.Flags().BoolVar(&showVersion, "version", false, "print the version, commit, Go version and edition")
	root.RunE = func(cmd *cobra.Command, args []string) error {
		if !showVersion {
			return cmd.Help()
		}
		fmt.Fprint(cmd.OutOrStdout(), version.Current().Text())
		return nil
	}
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	checkUsage(root)
	return root
}

// checkUsage makes every way of calling a command wrongly a usage error
// (exit 2), which cobra leaves as plain errors (exit 1) or, for a group
// such as `kiln key`, answers an unknown subcommand with its help and
// exit 0: an unknown command, a wrong number of arguments, a required flag
// left out.
func checkUsage(cmd *cobra.Command) {
	switch {
	case cmd.HasSubCommands():
		cmd.Args = unknownCommand
		if cmd.RunE == nil && cmd.Run == nil {
			cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
		}
	case cmd.Args != nil:
		args := cmd.Args
		cmd.Args = func(cmd *cobra.Command, a []string) error {
			err := args(cmd, a)
			var ue usageError
			if err != nil && !errors.As(err, &ue) {
				err = usageError{fmt.Errorf("%w (usage: %s)", err, usageLine(cmd))}
			}
			return err
		}
	}
	if cmd.PreRunE == nil && cmd.PreRun == nil {
		// Before cobra's own check of the same, which would exit 1.
		cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
			if err := cmd.ValidateRequiredFlags(); err != nil {
				return usageError{fmt.Errorf("%w (usage: %s)", err, usageLine(cmd))}
			}
			return nil
		}
	}
	for _, c := range cmd.Commands() {
		checkUsage(c)
	}
}

// unknownCommand refuses arguments to a command that only groups others.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	hint := fmt.Sprintf("run '%s --help' for the commands", cmd.CommandPath())
	cmd.SuggestionsMinimumDistance = 2 // cobra's own default, set only on its own path
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		hint = fmt.Sprintf("did you mean '%s %s'? (%s)", cmd.CommandPath(), s[0], hint)
	}
	return usageError{fmt.Errorf("unknown command %q for %q: %s", args[0], cmd.CommandPath(), hint)}
}

// usageLine is how cmd is called, from kiln on: "kiln key generate NAME".
func usageLine(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return cmd.Use
	}
	return cmd.Parent().CommandPath() + " " + cmd.Use
}

// subcommands is filled by the init functions of this package's other files,
// one file per command, so each command stays in one place.
var subcommands []func() *cobra.Command

// formatFlag adds --format text|json. -o/--output, its name before -o
// came to mean the file a command writes (build, bundle, reflash-stick),
// still sets it for the scripts that use it, unlisted.
func formatFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVar(format, "format", "text", "output format: text or json")
	cmd.Flags().StringVarP(format, "output", "o", "text", "the same as --format")
	cmd.Flags().MarkHidden("output")
}

// exactArgs is cobra.ExactArgs with kiln's usage exit code.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError{fmt.Errorf("%w (usage: %s)", err, usageLine(cmd))}
		}
		return nil
	}
}
