//go:build !nodeonly

package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/recipes"
)

func init() { subcommands = append(subcommands, newBuildCommand, newLockCommand) }

// fetchFlags are the flags every command that talks to registries shares.
type fetchFlags struct {
	insecure bool
}

func (f *fetchFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.insecure, "insecure-registries", false, "allow plain-HTTP registries (test setups only)")
}

func (f *fetchFlags) options() []fetch.Option {
	var o []fetch.Option
	if f.insecure {
		o = append(o, fetch.WithInsecure())
	}
	return o
}

func newBuildCommand() *cobra.Command {
	var (
		o     builder.Options
		fetch fetchFlags
	)
	cmd := &cobra.Command{
		Use:   "build RECIPE -o DISK",
		Short: "Build an appliance disk image from a recipe",
		Example: `  kiln build appliance.yaml -o disk.raw
  kiln build appliance.yaml -o disk.raw --refresh-lock   # re-resolve the tags first
  kiln build appliance.yaml -o disk.raw --secure-boot-key secureboot/db.key   # a recipe with secureBoot`,
		Long: `Build resolves the recipe's images (using RECIPE's lock file when it is fresh, writing one when
there is none), fetches and verifies them into the blob cache, stages the image partition and writes
the disk image. The output appears only when the build succeeded; an existing file is replaced then,
and left untouched by a failed or interrupted build.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needTools(cmd, diskTools); err != nil {
				return err
			}
			o.Fetch = fetch.options()
			o.Log = cmd.ErrOrStderr()
			o.Progress = newProgress()
			res, err := builder.Build(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			// The disk GUID is the digest of the disk's seal: the factory's record
			// that `kiln verify` and `kiln inspect` compare against.
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%s, %d images, disk GUID %s)\nagent: %s, %s\n", res.Output, human.Bytes(res.Layout.Size),
				len(res.Contents.Images), res.Layout.GUID, res.Agent.Version, human.Bytes(res.Agent.Size))
			return nil
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "disk image to write (required)")
	cmd.Flags().StringVar(&o.CacheDir, "cache", "", "blob cache directory (default $XDG_CACHE_HOME/kiln)")
	cmd.Flags().BoolVar(&o.RefreshLock, "refresh-lock", false, "re-resolve the recipe's tags and rewrite its lock file")
	cmd.Flags().StringVar(&o.Agent, "agent", "", "the node's kiln binary (kiln-agent, built with -tags nodeonly) for the recipe's arch (default: kiln-agent beside this binary, when the arches match)")
	cmd.Flags().StringVar(&o.SecureBootKey, "secure-boot-key", "", "the Secure Boot db private key (db.key from kiln key secureboot) that signs the boot files, for a recipe with secureBoot")
	cmd.MarkFlagRequired("output")
	fetch.register(cmd)
	return cmd
}

func newLockCommand() *cobra.Command {
	var fetch fetchFlags
	cmd := &cobra.Command{
		Use:     "lock RECIPE",
		Short:   "Resolve every image of a recipe to a digest; write the lock file beside it",
		Example: `  kiln lock appliance.yaml   # writes appliance.lock`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := recipes.Load(args[0])
			if err != nil {
				return err
			}
			lock, err := builder.Resolve(cmd.Context(), r, cmd.ErrOrStderr(), fetch.options()...)
			if err != nil {
				return err
			}
			path := recipes.LockPath(r.Path)
			if err := builder.WriteLock(lock, path, cmd.ErrOrStderr()); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%d images)\n", path, len(lock.Images))
			return nil
		},
	}
	fetch.register(cmd)
	return cmd
}

// newProgress shows a live bar on a terminal and plain lines otherwise,
// one every logEvery per running task between its start and its end.
func newProgress() progress.Reporter {
	return progress.New(os.Stderr, term.IsTerminal(int(os.Stderr.Fd())), progress.Every(logEvery))
}

// logEvery spaces the progress lines of a log (no terminal): often enough to
// show a long fetch or write is moving, rarely enough to keep a CI log short.
const logEvery = 10 * time.Second
