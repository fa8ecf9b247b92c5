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
		Use:           "kiln",
		Short:         "Build immutable appliance disk images with their container images inside",
		SilenceUsage:  true,
		SilenceErrors: true,
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
	return root
}

// subcommands is filled by the init functions of this package's other files,
// one file per command, so each command stays in one place.
var subcommands []func() *cobra.Command

// exactArgs is cobra.ExactArgs with kiln's usage exit code.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError{fmt.Errorf("%w (usage: kiln %s)", err, cmd.Use)}
		}
		return nil
	}
}
