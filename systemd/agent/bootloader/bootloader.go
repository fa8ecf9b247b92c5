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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf16"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// ESP is where the node mounts the ESP (systemd-gpt-auto-generator mounts it
// on an empty /efi).
const ESP = "/efi"

// Efivars is where efivarfs is mounted.
const Efivars = "/sys/firmware/efi/efivars"

// loaderVendor is the vendor GUID of the Boot Loader Interface's variables.
const loaderVendor = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"

func entriesDir(esp string) string { return filepath.Join(esp, bootentry.Dir) }

// Entries lists the entries on the ESP, by file name; other files are left
// out.
func Entries(esp string) ([]bootentry.Name, error) {
	des, err := os.ReadDir(entriesDir(esp))
	if err != nil {
		return nil, fmt.Errorf("boot loader entries: %w", err)
	}
	var out []bootentry.Name
	for _, de := range des {
		if !de.Type().IsRegular() || strings.HasPrefix(de.Name(), ".") {
			continue
		}
		if n, err := bootentry.ParseFileName(de.Name()); err == nil {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
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

// Remove deletes every file of the entry id.
func Remove(esp, id string) error { return remove(esp, id, "") }

func remove(esp, id, keep string) error {
	names, err := Entries(esp)
	if err != nil {
		return err
	}
	removed := false
	for _, n := range names {
		if n.ID != id || n.String() == keep {
			continue
		}
		if err := os.Remove(filepath.Join(entriesDir(esp), n.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("boot entry %s: %w", n, err)
		}
		removed = true
	}
	if !removed {
		return nil
	}
	return syncDir(entriesDir(esp))
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
// LoaderEntrySelected variable, without the ".conf" and without a counter),
// or "" when the boot loader did not say (not systemd-boot, not UEFI).
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
	if !strings.HasSuffix(s, bootentry.Suffix) {
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
