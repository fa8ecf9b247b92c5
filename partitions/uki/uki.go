// Package uki builds, signs, verifies and reads unified kernel images:
// systemd-stub with the kernel, the initramfs, the command line and
// os-release added as PE sections, one file the firmware checks as a
// whole under Secure Boot. The PE and Authenticode work is the standard
// tools' (objcopy, sbsign, sbverify); Go only reads the headers back.
package uki

import (
	"bytes"
	"context"
	"debug/pe"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kiln-appliance/kiln/internal/hosttools"
)

// Where Debian's systemd-boot-efi installs systemd-stub and systemd-boot.
const (
	Stub        = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	SystemdBoot = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
)

// stubPackage installs Stub and SystemdBoot; they are files, not programs
// in $PATH, so they are not host tools of their own.
const stubPackage = "systemd-boot-efi"

// Tools are the host tools this package runs.
var Tools = []string{"objcopy", "sbsign", "sbverify"}

// Inputs are the parts of a unified kernel image.
type Inputs struct {
	Stub      string   // systemd-stub; "" is Stub
	Kernel    string   // the kernel image
	Initrds   []string // concatenated into one .initrd, as the kernel takes concatenated cpio archives; none for no initramfs
	Cmdline   string   // the kernel command line, signed with the rest
	OSRelease []byte   // os-release: systemd-boot lists a UKI by it
}

// The sections Build adds, in the order systemd's docs add them.
const (
	secOSRel   = ".osrel"
	secCmdline = ".cmdline"
	secLinux   = ".linux"
	secInitrd  = ".initrd"
)

// minAlign is the least alignment of an added section: a page, so that
// firmware mapping sections page by page never shares one between them,
// whatever smaller SectionAlignment a stub has (Debian's: 512 bytes).
const minAlign = 4096

// Build writes the unified kernel image out from in, with objcopy as
// systemd's docs and ukify do: each section is placed at a virtual address
// after the stub's image end, aligned, computed from the stub's own
// headers. out is written whole or not at all.
func Build(ctx context.Context, out string, in Inputs) error {
	if err := hosttools.Check("objcopy"); err != nil {
		return err
	}
	if in.Stub == "" {
		in.Stub = Stub
	}
	switch {
	case in.Kernel == "":
		return errors.New("unified kernel image: no kernel given")
	case strings.TrimSpace(in.Cmdline) == "":
		return errors.New("unified kernel image: no command line given: without one the root hashes are not signed")
	case len(in.OSRelease) == 0:
		return errors.New("unified kernel image: no os-release given: systemd-boot lists a UKI by its os-release")
	}
	base, align, err := stubEnd(in.Stub)
	if err != nil {
		return err
	}

	tmp, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	osrel := filepath.Join(tmp, "os-release")
	cmdline := filepath.Join(tmp, "cmdline")
	if err := os.WriteFile(osrel, in.OSRelease, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(cmdline, []byte(in.Cmdline), 0o644); err != nil {
		return err
	}
	sections := []struct{ name, file string }{{secOSRel, osrel}, {secCmdline, cmdline}, {secLinux, in.Kernel}}
	switch len(in.Initrds) {
	case 0:
	case 1:
		sections = append(sections, struct{ name, file string }{secInitrd, in.Initrds[0]})
	default:
		initrd := filepath.Join(tmp, "initrd")
		if err := concat(initrd, in.Initrds); err != nil {
			return err
		}
		sections = append(sections, struct{ name, file string }{secInitrd, initrd})
	}

	args := []string{}
	vma := base
	for _, s := range sections {
		fi, err := os.Stat(s.file)
		if err != nil {
			return fmt.Errorf("unified kernel image %s: %w", s.name, err)
		}
		if fi.Size() == 0 {
			return fmt.Errorf("unified kernel image %s: %s is empty", s.name, s.file)
		}
		args = append(args, "--add-section", s.name+"="+s.file, "--change-section-vma", fmt.Sprintf("%s=%#x", s.name, vma))
		vma += roundUp(uint64(fi.Size()), align)
	}
	built := filepath.Join(tmp, "uki.efi")
	args = append(args, in.Stub, built)
	if o, err := exec.CommandContext(ctx, "objcopy", args...).CombinedOutput(); err != nil {
		return hosttools.RunError("objcopy "+out, err, o)
	}
	if err := os.Chmod(built, 0o644); err != nil {
		return err
	}
	return rename(built, out)
}

// stubEnd returns the virtual address (image base included, as objcopy
// takes it) where the first added section goes, and the alignment of
// added sections. A stub that is already a UKI is refused: objcopy would
// add a second .linux the stub never reads.
func stubEnd(stub string) (vma, align uint64, err error) {
	f, err := pe.Open(stub)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, 0, fmt.Errorf("systemd-stub %s is not there: install it as root with: apt-get install %s", stub, stubPackage)
		}
		return 0, 0, fmt.Errorf("systemd-stub %s is not a PE image (%v): give the linuxx64.efi.stub of Debian package %s", stub, err, stubPackage)
	}
	defer f.Close()
	var imageBase, sizeOfImage uint64
	var sectionAlign uint32
	switch h := f.OptionalHeader.(type) {
	case *pe.OptionalHeader64:
		imageBase, sizeOfImage, sectionAlign = h.ImageBase, uint64(h.SizeOfImage), h.SectionAlignment
	case *pe.OptionalHeader32:
		imageBase, sizeOfImage, sectionAlign = uint64(h.ImageBase), uint64(h.SizeOfImage), h.SectionAlignment
	default:
		return 0, 0, fmt.Errorf("systemd-stub %s has no PE optional header: it is an object file, not an EFI program", stub)
	}
	// systemd's EFI programs say what they are in .sdmagic, e.g.
	// "#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####"; systemd-boot
	// is a PE image too, with an .osrel of its own.
	var magic []byte
	if sec := f.Section(".sdmagic"); sec != nil {
		magic, _ = sectionBytes(sec)
	}
	if !bytes.Contains(magic, []byte("LoaderInfo: systemd-stub ")) {
		return 0, 0, fmt.Errorf("systemd-stub %s is a PE image but not systemd-stub (.sdmagic %q): give the linuxx64.efi.stub of Debian package %s",
			stub, bytes.TrimRight(magic, "\x00"), stubPackage)
	}
	for _, name := range []string{secOSRel, secCmdline, secLinux, secInitrd} {
		if f.Section(name) != nil {
			return 0, 0, fmt.Errorf("systemd-stub %s already has a %s section: it is a unified kernel image, not the bare stub", stub, name)
		}
	}
	end := sizeOfImage
	for _, s := range f.Sections {
		end = max(end, uint64(s.VirtualAddress)+uint64(memSize(s)))
	}
	align = max(uint64(sectionAlign), minAlign)
	return imageBase + roundUp(end, align), align, nil
}

// memSize is how much of the image a section takes in memory: its virtual
// size, or (when that is 0, as some linkers leave it) its size in the file.
func memSize(s *pe.Section) uint32 {
	if s.VirtualSize != 0 {
		return s.VirtualSize
	}
	return s.Size
}

func roundUp(n, align uint64) uint64 { return (n + align - 1) / align * align }

func concat(out string, files []string) error {
	w, err := os.Create(out)
	if err != nil {
		return err
	}
	for _, p := range files {
		r, err := os.Open(p)
		if err != nil {
			w.Close()
			return fmt.Errorf("unified kernel image initrd: %w", err)
		}
		_, err = io.Copy(w, r)
		r.Close()
		if err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}

// rename syncs a finished file and moves it into place.
func rename(tmp, out string) error {
	f, err := os.Open(tmp)
	if err != nil {
		return err
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// Sign writes out, the EFI program in signed with key and its certificate
// cert (the db key: the firmware boots what a db certificate verifies).
// in may be out; out is written whole or not at all.
func Sign(ctx context.Context, in, out, key, cert string) error {
	if err := hosttools.Check("sbsign"); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	signed := filepath.Join(tmp, "signed.efi")
	o, err := exec.CommandContext(ctx, "sbsign", "--key", key, "--cert", cert, "--output", signed, in).CombinedOutput()
	if err != nil {
		if bytes.Contains(o, []byte("key values mismatch")) || bytes.Contains(o, []byte("private key does not match certificate")) {
			return fmt.Errorf("sign %s: key %s does not match certificate %s: give the key the certificate was made for (kiln key secureboot writes db.key beside db.crt)", in, key, cert)
		}
		if notPE(o) {
			return fmt.Errorf("sign %s: it is not an EFI program (no PE header)", in)
		}
		return hosttools.RunError("sbsign "+in, err, quiet(o))
	}
	if err := os.Chmod(signed, 0o644); err != nil {
		return err
	}
	return rename(signed, out)
}

// The ways Verify fails on a file that is there and a certificate that
// reads, for errors.Is.
var (
	ErrUnsigned     = errors.New("not signed")
	ErrBadSignature = errors.New("signature does not verify")
)

// Verify checks that file carries a signature that cert verifies, as the
// firmware checks it against db: an unsigned file, one signed by another
// key and one changed after signing all fail, naming file.
func Verify(ctx context.Context, file, cert string) error {
	if err := hosttools.Check("sbverify"); err != nil {
		return err
	}
	if _, err := os.Stat(file); err != nil {
		return fmt.Errorf("verify signature: %w", err)
	}
	o, err := exec.CommandContext(ctx, "sbverify", "--cert", cert, file).CombinedOutput()
	switch {
	case err == nil:
		return nil
	case notPE(o):
		return fmt.Errorf("%s: %w: it is not an EFI program (no PE header)", file, ErrUnsigned)
	case bytes.Contains(o, []byte("No signature table present")):
		return fmt.Errorf("%s: %w: Secure Boot firmware refuses to boot it; sign it with the db key", file, ErrUnsigned)
	case bytes.Contains(o, []byte("Signature verification failed")):
		return fmt.Errorf("%s: %w against %s: signed by another key, or changed after signing", file, ErrBadSignature, cert)
	}
	return hosttools.RunError(fmt.Sprintf("sbverify --cert %s %s", cert, file), err, quiet(o))
}

// notPE tells sbsigntool's complaint about a file that is not PE at all.
func notPE(out []byte) bool { return bytes.Contains(out, []byte("Invalid DOS header magic")) }

// quiet drops the warning sbsigntool prints for the symbol table Debian's
// stub carries after its sections ("gaps between PE/COFF sections?"):
// harmless, the table is hashed and signed like the rest, and it would
// hide the line that says what went wrong.
func quiet(out []byte) []byte {
	var keep [][]byte
	for _, l := range bytes.Split(out, []byte("\n")) {
		if !bytes.HasPrefix(l, []byte("warning: data remaining[")) {
			keep = append(keep, l)
		}
	}
	return bytes.Join(keep, []byte("\n"))
}

// Sections are what Read gives of a unified kernel image.
type Sections struct {
	Cmdline   string // the signed kernel command line
	OSRelease []byte // the os-release systemd-boot shows
}

// Read returns the command line and os-release of the unified kernel
// image file. It does not check the signature (Verify does).
func Read(file string) (Sections, error) {
	f, err := pe.Open(file)
	if err != nil {
		return Sections{}, fmt.Errorf("%s is not a unified kernel image: %w", file, err)
	}
	defer f.Close()
	for _, name := range []string{secLinux, secCmdline, secOSRel} {
		if f.Section(name) == nil {
			return Sections{}, fmt.Errorf("%s is not a unified kernel image: no %s section", file, name)
		}
	}
	cmdline, err := sectionBytes(f.Section(secCmdline))
	if err != nil {
		return Sections{}, fmt.Errorf("%s: section %s: %w", file, secCmdline, err)
	}
	osrel, err := sectionBytes(f.Section(secOSRel))
	if err != nil {
		return Sections{}, fmt.Errorf("%s: section %s: %w", file, secOSRel, err)
	}
	return Sections{Cmdline: string(cmdline), OSRelease: osrel}, nil
}

// sectionBytes is a section's content without the zeros that pad it to
// the file alignment: VirtualSize is its length.
func sectionBytes(sec *pe.Section) ([]byte, error) {
	b, err := sec.Data()
	if err != nil {
		return nil, err
	}
	if n := int(sec.VirtualSize); n > 0 && n < len(b) {
		b = b[:n]
	}
	return b, nil
}

// Param returns the value of the kernel command line parameter name (the
// last one, as the kernel and systemd take it), e.g. Param("usrhash").
func (s Sections) Param(name string) (string, bool) {
	val, found := "", false
	for _, f := range strings.Fields(s.Cmdline) {
		k, v, _ := strings.Cut(f, "=")
		if k == name {
			val, found = v, true
		}
	}
	return val, found
}

// LoaderInfo returns what a systemd EFI program says it is in its .sdmagic
// section, e.g. "systemd-boot 252.39-1~deb12u2" or "systemd-stub 252…";
// "" for a PE image without one (not systemd's).
func LoaderInfo(file string) (string, error) {
	f, err := pe.Open(file)
	if err != nil {
		return "", fmt.Errorf("%s is not an EFI program: %w", file, err)
	}
	defer f.Close()
	sec := f.Section(".sdmagic")
	if sec == nil {
		return "", nil
	}
	b, err := sectionBytes(sec)
	if err != nil {
		return "", fmt.Errorf("%s: section .sdmagic: %w", file, err)
	}
	s := strings.TrimRight(string(b), "\x00")
	s = strings.TrimSpace(strings.Trim(strings.TrimSpace(s), "#"))
	return strings.TrimPrefix(s, "LoaderInfo: "), nil
}
