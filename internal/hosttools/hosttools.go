// Package hosttools names the programs kiln runs on the factory host and
// the Debian package of each, so that a command can check for all of them
// before any work, and a tool's failure says what to install rather than
// only "executable file not found".
package hosttools

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// Tool is one program kiln runs.
type Tool struct {
	Name    string // as run, looked up in $PATH
	Package string // the Debian package that installs it
	Use     string // what kiln runs it for
}

// The factory's host tools, one row each: what `kiln build`, `bundle`,
// `reflash-stick`, `inspect`, `verify` and `key secureboot` may run. The README lists the
// same rows (a test checks), and the Makefile's APT_PKGS installs them.
// Everything else (partition tables, the squashfs writer and readers,
// dm-verity, signing, fetching) is Go inside kiln.
var Tools = []Tool{
	{Name: "debugfs", Package: "e2fsprogs", Use: "writes the Ignition config into the base's boot partition (and reads a --from disk's)"},
	{Name: "mksquashfs", Package: "squashfs-tools", Use: "writes a compressed image partition (imagePartition.compression)"},
	{Name: "xz", Package: "xz-utils", Use: "decompresses a base downloaded as .xz"},
	{Name: "mcopy", Package: "mtools", Use: "reads the boot loader entries and kernels of a base with A/B OS slots"},
	{Name: "systemd-analyze", Package: "systemd", Use: "checks a recipe's upgrade.rebootWindow"},
	{Name: "objcopy", Package: "binutils", Use: "assembles unified kernel images from systemd-stub (Debian package systemd-boot-efi), a kernel, an initramfs and a command line"},
	{Name: "sbsign", Package: "sbsigntool", Use: "signs unified kernel images and systemd-boot with the Secure Boot db key"},
	{Name: "sbverify", Package: "sbsigntool", Use: "checks the signatures of unified kernel images and systemd-boot against a db certificate"},
	{Name: "cert-to-efi-sig-list", Package: "efitools", Use: "turns the Secure Boot certificates into EFI signature lists (kiln key secureboot)"},
	{Name: "sign-efi-sig-list", Package: "efitools", Use: "signs those lists into the .auth files systemd-boot enrols (kiln key secureboot)"},
	{Name: "mmd", Package: "mtools", Use: "makes directories on a Secure Boot disk's ESP (EFI/Linux, loader/keys)"},
	{Name: "mdir", Package: "mtools", Use: "lists the directories of a Secure Boot disk's ESP"},
	{Name: "mdel", Package: "mtools", Use: "removes the boot loader entries the signed unified kernel images replace"},
}

// Lookup returns the row of the named tool.
func Lookup(name string) (Tool, bool) {
	i := slices.IndexFunc(Tools, func(t Tool) bool { return t.Name == name })
	if i < 0 {
		return Tool{}, false
	}
	return Tools[i], true
}

// MissingError lists the tools a command needs that are not in $PATH.
type MissingError struct {
	Missing []Tool
}

func (e *MissingError) Error() string {
	var names, pkgs []string
	for _, t := range e.Missing {
		names = append(names, fmt.Sprintf("%s (Debian package %s)", t.Name, t.Package))
		if !slices.Contains(pkgs, t.Package) {
			pkgs = append(pkgs, t.Package)
		}
	}
	return fmt.Sprintf("host tools not installed: %s; install them as root with: apt-get install %s",
		strings.Join(names, ", "), strings.Join(pkgs, " "))
}

// Unwrap lets errors.Is(err, exec.ErrNotFound) hold, as for the tool's
// own run.
func (e *MissingError) Unwrap() error { return exec.ErrNotFound }

// Check looks every named tool up in $PATH and returns a *MissingError
// naming all that are missing, or nil. Naming a tool not in Tools is a
// bug in kiln, reported as an error rather than skipped.
func Check(names ...string) error {
	var missing []Tool
	for _, n := range names {
		t, ok := Lookup(n)
		if !ok {
			return fmt.Errorf("hosttools: %q is not in the table of host tools", n)
		}
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return &MissingError{Missing: missing}
	}
	return nil
}

// RunError is the error of a tool run that failed: what (the step, e.g.
// "debugfs stat /ignition"), the run's error and what the tool printed,
// if anything. A tool that is not installed is named with its package.
func RunError(what string, err error, output []byte) error {
	var ee *exec.Error
	if errors.As(err, &ee) && errors.Is(ee.Err, exec.ErrNotFound) {
		if t, ok := Lookup(ee.Name); ok {
			return fmt.Errorf("%s: %w", what, &MissingError{Missing: []Tool{t}})
		}
		return fmt.Errorf("%s: %s is not installed", what, ee.Name)
	}
	if out := bytes.TrimSpace(output); len(out) > 0 {
		return fmt.Errorf("%s: %w: %s", what, err, out)
	}
	return fmt.Errorf("%s: %w", what, err)
}
