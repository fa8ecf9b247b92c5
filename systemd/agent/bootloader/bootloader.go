// Package bootloader reads and writes the node's boot loader entries on the
// ESP (bootentry's format) and reads which one the boot loader booted.
//
// A new release's entry is written with tries left and only once its slots
// are written and checked, so a power cut at any moment leaves either no
// entry of the new release or a whole one; systemd-boot and
// systemd-bless-boot do the counting and the fallback, kiln never rewrites a
// counter itself.
package bootloader

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode/utf16"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/opencontainers/go-digest"
)

// ESP is where the node mounts the ESP (systemd-gpt-auto-generator mounts it
// on an empty /efi).
const ESP = "/efi"

// Efivars is where efivarfs is mounted.
const Efivars = "/sys/firmware/efi/efivars"

// loaderVendor is the vendor GUID of the Boot Loader Interface's variables.
const loaderVendor = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"

func entriesDir(esp string) string { return filepath.Join(esp, bootentry.Dir) }

func ukiDir(esp string) string { return filepath.Join(esp, filepath.FromSlash(bootentry.UKIDir)) }

// Entries lists the entries on the ESP, by file name: the type #1 entries
// of loader/entries and the type #2 ones (signed unified kernel images) of
// EFI/Linux; other files are left out. A Secure Boot disk may have no
// loader/entries at all.
func Entries(esp string) ([]bootentry.Name, error) {
	var out []bootentry.Name
	found := false
	for _, d := range []struct {
		dir string
		uki bool
	}{{entriesDir(esp), false}, {ukiDir(esp), true}} {
		des, err := os.ReadDir(d.dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("boot loader entries: %w", err)
		}
		found = true
		for _, de := range des {
			if !de.Type().IsRegular() || strings.HasPrefix(de.Name(), ".") {
				continue
			}
			if n, err := bootentry.ParseFileName(de.Name()); err == nil && n.UKI == d.uki {
				out = append(out, n)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("boot loader entries: neither %s nor %s is on the ESP: %w", bootentry.Dir, bootentry.UKIDir, os.ErrNotExist)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path() < out[j].Path() })
	return out, nil
}

// Install writes e with tries left (0: as good, no counter), then removes
// every other file of e.ID: the entry of a release tried again starts its
// count afresh. The temp file is written beside loader/entries, where
// systemd-boot never reads it.
func Install(esp string, e bootentry.Entry, tries int, opts ...atomicfile.Option) error {
	var b bytes.Buffer
	if err := e.Encode(&b); err != nil {
		return err
	}
	name := bootentry.FileName(e.ID, tries)
	dir := entriesDir(esp)
	opts = append([]atomicfile.Option{atomicfile.WithTempDir(filepath.Dir(dir))}, opts...)
	if err := atomicfile.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644, opts...); err != nil {
		return fmt.Errorf("boot entry %s: %w", name, err)
	}
	return remove(esp, e.ID, name)
}

// InstallUKI makes the signed unified kernel image at src (a file on the
// ESP, written and checked by the import) the type #2 entry id with tries
// left: renamed into EFI/Linux in one step, so systemd-boot sees no entry
// or a whole one and the ESP never holds the image twice; then every other
// file of id is removed.
func InstallUKI(esp, id, src string, tries int) error {
	name := bootentry.UKIFileName(id, tries)
	dir := ukiDir(esp)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("boot entry %s: %w", name, err)
	}
	if err := os.Rename(src, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("boot entry %s: %w", name, err)
	}
	for _, d := range []string{dir, filepath.Dir(src)} {
		if err := syncDir(d); err != nil {
			return fmt.Errorf("boot entry %s: %w", name, err)
		}
	}
	return remove(esp, id, name)
}

// Remove deletes every file of the entry id.
func Remove(esp, id string) error { return remove(esp, id, "") }

// RemoveWithFiles deletes every file of the entry id, then the kernel and
// initramfs images it booted that no other entry boots (its release's, the
// factory's included: they are where the vendor put them), and returns
// those. A cut between the two leaves files no entry boots, which take
// space and nothing else.
func RemoveWithFiles(esp, id string) ([]string, error) {
	n, found, err := Find(esp, id)
	if err != nil || !found {
		return nil, err
	}
	e, err := Read(esp, n)
	if err != nil {
		return nil, err
	}
	if err := Remove(esp, id); err != nil {
		return nil, err
	}
	used, err := bootedFiles(esp)
	if err != nil {
		return nil, err
	}
	var gone []string
	for _, p := range append([]string{e.Linux}, e.Initrd...) {
		full := espPath(esp, p)
		if p == "" || used[strings.ToLower(full)] || !strings.HasPrefix(full, filepath.Clean(esp)+string(filepath.Separator)) {
			continue
		}
		switch err := os.Remove(full); {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return gone, fmt.Errorf("boot file %s: %w", p, err)
		default:
			gone = append(gone, p)
		}
	}
	return gone, nil
}

// bootedFiles are the kernel and initramfs paths (lower case: FAT) of every
// entry on the ESP.
func bootedFiles(esp string) (map[string]bool, error) {
	names, err := Entries(esp)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, n := range names {
		e, err := Read(esp, n)
		if err != nil {
			return nil, err
		}
		for _, p := range append([]string{e.Linux}, e.Initrd...) {
			if p != "" { // a UKI's kernel is inside it
				used[strings.ToLower(espPath(esp, p))] = true
			}
		}
	}
	return used, nil
}

func remove(esp, id, keep string) error {
	names, err := Entries(esp)
	if err != nil {
		return err
	}
	removed := map[string]bool{}
	for _, n := range names {
		if n.ID != id || n.String() == keep {
			continue
		}
		p := espPath(esp, n.Path())
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("boot entry %s: %w", n, err)
		}
		removed[filepath.Dir(p)] = true
	}
	for d := range removed {
		if err := syncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Booted is the ID of the entry the boot loader booted this time (its
// LoaderEntrySelected variable, without the ".conf" or ".efi" and without a
// counter), or "" when the boot loader did not say (not systemd-boot, not
// UEFI). For a type #2 entry systemd-boot says its file name, lower case.
func Booted(efivars string) (string, error) {
	b, err := os.ReadFile(filepath.Join(efivars, "LoaderEntrySelected-"+loaderVendor))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("the booted entry: %w", err)
	}
	s, err := efiString(b)
	if err != nil {
		return "", fmt.Errorf("the booted entry (LoaderEntrySelected): %w", err)
	}
	if !strings.HasSuffix(s, bootentry.Suffix) && !strings.HasSuffix(s, bootentry.UKISuffix) {
		s += bootentry.Suffix // an ID without its file's suffix
	}
	n, err := bootentry.ParseFileName(s)
	if err != nil {
		return "", fmt.Errorf("the booted entry: %w", err)
	}
	return n.ID, nil
}

// efiString decodes an efivarfs file holding a string: 4 bytes of
// attributes, then UTF-16LE, NUL-terminated.
func efiString(b []byte) (string, error) {
	if len(b) < 4 || len(b)%2 != 0 {
		return "", errors.New("not a UTF-16 string variable")
	}
	u := make([]uint16, 0, (len(b)-4)/2)
	for i := 4; i+1 < len(b); i += 2 {
		c := uint16(b[i]) | uint16(b[i+1])<<8
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return string(utf16.Decode(u)), nil
}

// Find is the file of entry id on the ESP, whatever its counter; false when
// there is none.
func Find(esp, id string) (bootentry.Name, bool, error) {
	names, err := Entries(esp)
	if err != nil {
		return bootentry.Name{}, false, err
	}
	for _, n := range names {
		if n.ID == id {
			return n, true, nil
		}
	}
	return bootentry.Name{}, false, nil
}

// Read decodes the entry in file n. A type #2 entry's is its signed
// command line (the kernel and initramfs are inside it: no paths); its
// signature is not checked here (uki.CheckSignature).
func Read(esp string, n bootentry.Name) (*bootentry.Entry, error) {
	if n.UKI {
		s, err := uki.Read(espPath(esp, n.Path()))
		if err != nil {
			return nil, fmt.Errorf("boot entry %s: %w", n, err)
		}
		return &bootentry.Entry{ID: n.ID, Options: strings.Fields(s.Cmdline)}, nil
	}
	f, err := os.Open(filepath.Join(entriesDir(esp), n.String()))
	if err != nil {
		return nil, fmt.Errorf("boot entry: %w", err)
	}
	defer f.Close()
	return bootentry.Decode(n.String(), f)
}

// BootFileDir: see bootentry.FileDir.
const BootFileDir = bootentry.FileDir

// BootFilePath: see bootentry.FilePath.
func BootFilePath(d string) string { return bootentry.FilePath(d) }

// espPath is where an entry's path p is on the ESP mounted at esp: p is
// cleaned as a rooted path first, so a ".." in it stays inside the ESP.
func espPath(esp, p string) string {
	return filepath.Join(esp, filepath.Clean("/"+filepath.FromSlash(p)))
}

// HasBootFile reports whether the boot file with digest d is in place,
// whole (its bytes hashed).
func HasBootFile(esp, d string) (bool, error) {
	ok, err := fileHas(espPath(esp, BootFilePath(d)), d)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return ok, err
}

// fileHas reports whether the file at p hashes to d.
func fileHas(p, d string) (bool, error) {
	got, _, err := filedigest.Of(p)
	return got == d, err
}

// Digest is the sha256 ("sha256:HEX") of the file at p, a path as an
// entry names it.
func Digest(esp, p string) (string, error) {
	d, _, err := filedigest.Of(espPath(esp, p))
	return d, err
}

// WriteBootFile puts the boot file with digest d (size bytes, read from r)
// in its place on the ESP: streamed to a temp file beside it, hashed as it
// is written, synced and renamed only when it is exactly d. A file in place
// that hashes to d is kept.
func WriteBootFile(esp, d string, size int64, r io.Reader) error {
	if ok, err := HasBootFile(esp, d); err != nil || ok {
		return err
	}
	dst := espPath(esp, BootFilePath(d))
	return atomicfile.Write(dst, 0o644, func(w io.Writer) error {
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(r, size+1))
		if err != nil {
			return fmt.Errorf("boot file %s: %w", d, err)
		}
		if got := digest.NewDigest(digest.SHA256, h).String(); n != size || got != d {
			return fmt.Errorf("boot file %s: read %d bytes hashing to %s, want %d bytes: %w", d, n, got, size, contract.ErrDamaged)
		}
		return nil
	})
}

// FindFile finds, among the files the ESP's entries boot (kernel and
// initramfs) but those of the entries skip names, one with digest d and
// size bytes: the node's own copy of a boot file a bundle leaves out. ""
// when none is.
func FindFile(esp, d string, size int64, skip ...bootentry.Name) (string, error) {
	names, err := Entries(esp)
	if err != nil {
		return "", err
	}
	seen := map[string]bool{}
	for _, n := range names {
		if slices.Contains(skip, n) {
			continue
		}
		e, err := Read(esp, n)
		if err != nil {
			return "", err
		}
		for _, p := range append([]string{e.Linux}, e.Initrd...) {
			if p == "" || seen[p] {
				continue
			}
			seen[p] = true
			full := espPath(esp, p)
			if fi, err := os.Stat(full); err != nil || fi.Size() != size {
				continue
			}
			if ok, err := fileHas(full, d); err != nil {
				return "", err
			} else if ok {
				return full, nil
			}
		}
	}
	return "", nil
}

// RemoveUnusedBootFiles removes the files of BootFileDir that no entry on
// the ESP boots (a retired release's kernel, a copy an interrupted import
// left) and returns their names. Only BootFileDir is touched: the factory's
// files are where the vendor put them.
func RemoveUnusedBootFiles(esp string) ([]string, error) {
	dir := espPath(esp, BootFileDir)
	des, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("boot files: %w", err)
	}
	used, err := bootedFiles(esp)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if used[strings.ToLower(p)] || strings.HasPrefix(de.Name(), ".") && !strings.Contains(de.Name(), ".tmp-") {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("boot files: %w", err)
		}
		removed = append(removed, de.Name())
	}
	if len(removed) == 0 {
		return nil, nil
	}
	return removed, syncDir(dir)
}
