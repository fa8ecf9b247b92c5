package osslots

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// Upgradable says whether a node's upgrades rewrite partition p: the ESP
// (boot loader entries, boot files) and every usr and usr-verity partition.
func Upgradable(p gpt.Partition) bool {
	if p.Type == ESPType {
		return true
	}
	for a, t := range contract.UsrPartTypes {
		if p.Type == t || p.Type == contract.UsrVerityPartTypes[a] {
			return true
		}
	}
	return false
}

// BootedError names the part of a booted disk that failed CheckBooted.
type BootedError struct {
	Part string // "partition 5 (usr-b)", "partition 1 (EFI-SYSTEM)"
	Err  error
}

func (e *BootedError) Error() string { return e.Part + ": " + e.Err.Error() }
func (e *BootedError) Unwrap() error { return e.Err }

// CheckBooted checks the partitions of a booted disk at path (a raw file
// or device) that upgrades rewrote (changed: they differ from the build),
// by what the node wrote, as its boot loader reads them:
//   - a slot a boot loader entry boots, every block of it through dm-verity
//     against the entry's usrhash= (the root hash the node proved against
//     the signed bundle before it wrote the entry);
//   - a slot no entry boots is not checked: the node never boots it so (an
//     upgrade wrote it, or began to);
//   - on the ESP, every kernel and initramfs an entry names under
//     bootentry.FileDir, against the sha256 it is named by; the ESP's other files
//     are not checked (the boot loader writes there too).
//
// It returns what it checked and what it could not, in seal.Report's words.
func CheckBooted(ctx context.Context, path string, l *gpt.Layout, changed []gpt.Partition) (checked, unchecked []string, err error) {
	if len(changed) == 0 {
		return nil, nil, nil
	}
	esp, err := findESP(l)
	if err != nil {
		return nil, nil, err
	}
	raw, err := readEntries(base.InPlace(path, l), esp)
	if err != nil {
		return nil, nil, err
	}
	var entries []*bootentry.Entry
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		e, err := bootentry.Decode(name, strings.NewReader(string(raw[name])))
		if errors.Is(err, bootentry.ErrNotEntry) {
			continue
		}
		if err != nil {
			return nil, nil, &BootedError{partName(esp), err}
		}
		entries = append(entries, e)
	}
	isChanged := func(p gpt.Partition) bool {
		return slices.ContainsFunc(changed, func(c gpt.Partition) bool { return c.Number == p.Number })
	}
	s, err := FromLayout(l)
	if err != nil {
		return nil, nil, err
	}
	if s != nil {
		for _, sl := range s.Slots {
			usr, _ := l.Find(sl.Usr.Name)
			hash, _ := l.Find(sl.UsrVerity.Name)
			if !isChanged(*usr) && !isChanged(*hash) {
				continue
			}
			c, u, err := checkSlot(ctx, path, *usr, *hash, isChanged, entries)
			if err != nil {
				return nil, nil, err
			}
			checked, unchecked = append(checked, c...), append(unchecked, u...)
		}
	}
	if isChanged(esp) {
		c, err := checkBootFiles(path, l, esp, entries)
		if err != nil {
			return nil, nil, err
		}
		checked = append(checked, c)
		unchecked = append(unchecked, partName(esp)+": its other files (the factory's boot files, the boot loader's own): the boot loader writes the ESP (a random seed, tries counted down in entry names)")
	}
	return checked, unchecked, nil
}

// checkSlot checks the slot usr (hash tree in hash) against the root hash
// of the entries that boot it; a slot no entry boots is reported by the
// partitions of it that changed (the seal checked the others).
func checkSlot(ctx context.Context, disk string, usr, hash gpt.Partition, changed func(gpt.Partition) bool, entries []*bootentry.Entry) (checked, unchecked []string, err error) {
	part := fmt.Sprintf("%s and %d (%s)", partName(usr), hash.Number, hash.Name)
	var boots []*bootentry.Entry
	var rootHash string
	for _, e := range entries {
		u, ok, err := bootentry.ParseUsrVerity(e.Options)
		if err != nil {
			return nil, nil, &BootedError{"boot loader entry " + e.ID, err}
		}
		if !ok || u.DataPartUUID != strings.ToLower(usr.GUID) {
			continue
		}
		if u.HashPartUUID != strings.ToLower(hash.GUID) {
			return nil, nil, &BootedError{"boot loader entry " + e.ID, fmt.Errorf("mounts %s with the hash tree of PARTUUID %s, not its own %s: the node never writes such an entry", partName(usr), u.HashPartUUID, partName(hash))}
		}
		if rootHash != "" && u.RootHash != rootHash {
			return nil, nil, &BootedError{part, fmt.Errorf("entries %s and %s boot it with different root hashes: the node keeps one release per slot", boots[0].ID, e.ID)}
		}
		rootHash = u.RootHash
		boots = append(boots, e)
	}
	if len(boots) == 0 {
		which := part
		switch {
		case !changed(hash):
			which = partName(usr)
		case !changed(usr):
			which = partName(hash)
		}
		return nil, []string{which + ": no boot loader entry boots this slot (an upgrade wrote it, or began to): the boot loader never boots it as it is"}, nil
	}
	f, err := os.Open(disk)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if _, err := verity.ReadSlot(ctx, io.NewSectionReader(f, usr.Offset, usr.Size), io.NewSectionReader(f, hash.Offset, hash.Size), rootHash); err != nil {
		return nil, nil, &BootedError{part, fmt.Errorf("fails dm-verity against root hash %s, with which %s boots it: %w; the node would stop at this slot's first bad block: reflash the disk", rootHash, entryNames(boots), err)}
	}
	return []string{fmt.Sprintf("%s: every block through dm-verity (root hash %s, as %s boots it)", part, rootHash, entryNames(boots))}, nil, nil
}

// entryNames is "entry kiln-1.1.0 (version 1.1)" for each entry: the
// entry's own version line, which is the OS's (the vendor's base entry's).
func entryNames(es []*bootentry.Entry) string {
	var s []string
	for _, e := range es {
		n := "entry " + e.ID
		if e.Version != "" {
			n += " (version " + e.Version + ")"
		}
		s = append(s, n)
	}
	return strings.Join(s, ", ")
}

// checkBootFiles checks every file the entries name under bootentry.FileDir
// against the sha256 it is named by.
func checkBootFiles(disk string, l *gpt.Layout, esp gpt.Partition, entries []*bootentry.Entry) (string, error) {
	var paths []string
	for _, e := range entries {
		for _, p := range append([]string{e.Linux}, e.Initrd...) {
			if strings.HasPrefix(p, "/"+bootentry.FileDir+"/") && !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.ID)
	}
	what := fmt.Sprintf("%s: boot loader entries %s", partName(esp), strings.Join(ids, ", "))
	if len(paths) == 0 {
		return what, nil
	}
	dir, err := os.MkdirTemp("", "kiln-boot-files-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	copies, err := CopyFromESP(base.InPlace(disk, l), dir, paths)
	if err != nil {
		return "", &BootedError{partName(esp), err}
	}
	for i, c := range copies {
		d, _, err := filedigest.Of(c)
		if err != nil {
			return "", err
		}
		if got := digest.Digest(d).Encoded(); got != path.Base(paths[i]) {
			return "", &BootedError{partName(esp), fmt.Errorf("%s holds bytes whose sha256 is %s: damaged; the node checks it only as it copies it, so reflash the disk", paths[i], got)}
		}
	}
	return fmt.Sprintf("%s, and the %d kernel and initramfs files they name under /%s, each against the sha256 it is named by", what, len(paths), bootentry.FileDir), nil
}

func partName(p gpt.Partition) string { return fmt.Sprintf("partition %d (%s)", p.Number, p.Name) }
