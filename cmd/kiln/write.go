//go:build !nodeonly

package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/builder/stickwrite"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

func init() { subcommands = append(subcommands, newWriteCommand) }

func newWriteCommand() *cobra.Command {
	var (
		o        stickwrite.Options
		noVerify bool
		keys     []string
	)
	cmd := &cobra.Command{
		Use:   "write IMAGE DEVICE",
		Short: "Write a disk or stick image to a removable device, then read it back",
		Example: `  kiln write disk.raw /dev/sdX
  kiln write upgrade.img /dev/sdX --key factory.pub
  kiln write reflash.img /dev/sdX`,
		Long: `Write checks IMAGE as kiln verify does (a bundle needs --key), refuses a DEVICE that is not a whole
block device, is mounted or held, is not removable (unless --force) or is smaller than IMAGE, all
before writing anything; then writes IMAGE from the device's first byte, flushes, drops the
kernel's cache and reads every byte back, comparing sha256. It says "done" only then.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			image, dev := args[0], args[1]
			fi, err := os.Stat(image)
			if err != nil {
				return fmt.Errorf("image: %w", err)
			}
			if !fi.Mode().IsRegular() {
				return fmt.Errorf("image %s is not a regular file: give the image file to write: a disk (kiln build -o), an upgrade stick image (kiln bundle -o) or a recovery stick image (kiln reflash-stick -o)", image)
			}
			d, err := stickwrite.Open(dev)
			if err != nil {
				return err
			}
			// Device first: refusing a wrong device must not wait for a long verify.
			if err := d.Check(fi.Size(), o); err != nil {
				return err
			}
			w := cmd.ErrOrStderr()
			if err := checkImage(cmd, image, keys, noVerify); err != nil {
				return err
			}
			digest, err := stickwrite.Write(cmd.Context(), image, d, newProgress())
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "done: %s holds %s (%s, %s), read back and identical; remove the stick\n", dev, image, human.Bytes(fi.Size()), digest)
			return nil
		},
	}
	cmd.Flags().BoolVar(&o.Force, "force", false, "write to a device that is not removable (check with lsblk that it is the right one)")
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "write an image that is not a kiln disk or bundle (it is still read back)")
	cmd.Flags().StringArrayVar(&keys, "key", nil, "public key a bundle stick image must be signed with (NAME.pub; repeatable)")
	return cmd
}

// checkImage runs kiln verify's checks on a kiln disk or bundle. Only an
// image that is neither may be written unchecked, with --no-verify.
func checkImage(cmd *cobra.Command, image string, keys []string, noVerify bool) error {
	id, err := identify(image)
	if err != nil {
		return err
	}
	switch id.kind {
	case bundleImage:
		if len(keys) == 0 {
			return usageError{fmt.Errorf("%s is an upgrade bundle: give the public key(s) to check its signature with --key NAME.pub", image)}
		}
		pubs, err := readKeys(keys)
		if err != nil {
			return err
		}
		if _, err := bundle.Verify(cmd.Context(), image, pubs, newProgress()); err != nil {
			return fmt.Errorf("not writing %s: %w", image, err)
		}
		return nil
	case reflashStick:
		if _, err := seal.Verify(cmd.Context(), image, seal.VerifyOptions{PartitionName: recovery.PartitionName, Progress: newProgress()}); err != nil {
			return fmt.Errorf("not writing %s: %s failed verification; the stick image is damaged or was modified: make it again: %w", image, image, err)
		}
		return nil
	case otherDisk, notKiln:
		if noVerify {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s is not a kiln disk or bundle: writing it unchecked (--no-verify); it is still read back\n", image)
			return nil
		}
		return fmt.Errorf("%v; so kiln cannot check it: give --no-verify to write it anyway", id.notKilnError(image))
	}
	if _, err := builder.Verify(cmd.Context(), image, builder.VerifyOptions{}, newProgress()); err != nil {
		return fmt.Errorf("not writing %s: %w", image, err)
	}
	return nil
}

// verifyReflashStick checks a stick image (or a written stick) against the
// seal kiln reflash-stick left in it: every byte, the payload by sha256.
func verifyReflashStick(cmd *cobra.Command, path string) error {
	rep, err := seal.Verify(cmd.Context(), path, seal.VerifyOptions{PartitionName: recovery.PartitionName, Progress: newProgress()})
	if err != nil {
		return fmt.Errorf("%s failed verification; the stick is damaged or was modified: make or write it again:\n  %w", path, err)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "%s: a recovery reflash stick, checked against its seal:\n", path)
	printChecks(w, path, rep.Checked, rep.Unchecked, "exactly the bytes kiln reflash-stick wrote")
	return nil
}
