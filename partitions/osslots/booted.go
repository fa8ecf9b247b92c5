package osslots

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/internal/human"
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
// by what the node wrote, as its boot loader reads them; slots is kiln.json's
// (nil: the disk has none):
//   - on the ESP, every boot loader entry the factory wrote, byte for byte
//     against the digest kiln.json records for its ID (slots.Boot), and the
//     factory's kernel and initramfs against theirs; an entry kiln.json does
//     not record is the node's, written from a signed bundle: it must be as
//     the node writes entries (bootentry.Encode, boot files under
//     bootentry.FileDir), and its command line is reported as not checked;
//   - a slot a boot loader entry boots, every block of it through dm-verity
//     against the entry's usrhash= (the root hash the node proved against
//     the signed bundle before it wrote the entry);
//   - a slot no entry boots is not checked: the node never boots it so (an
//     upgrade wrote it, or began to);
//   - on the ESP, every kernel and initramfs an entry names under
//     bootentry.FileDir, against the sha256 it is named by; the ESP's other files
//     are not checked (the boot loader writes there too).
//
// A disk whose kiln.json records no entries (built before kiln did) has
// its entries reported as not checked.
//
// It returns what it checked and what it could not, in seal.Report's words.
//
// ukis are the unified kernel images on a Secure Boot disk's ESP, as
// entries of their signed command lines (their signatures are checked
// elsewhere): a slot one of them boots is checked against its root hash as
// a type #1 entry's is.
func CheckBooted(ctx context.Context, path string, l *gpt.Layout, slots *contract.OSSlots, changed []gpt.Partition, ukis []*bootentry.Entry) (checked, unchecked []string, err error) {
	if len(changed) == 0 {
		return nil, nil, nil
	}
	esp, err := FindESP(l)
	if err != nil {
		return nil, nil, err
	}
	raw, err := readEntries(base.InPlace(path, l), esp)
	if err != nil {
		return nil, nil, err
	}
	var entries []*bootentry.Entry
	files := map[*bootentry.Entry]string{} // each entry's file name
	var strays []string                    // files in the entries' directory that are no entry
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		e, err := bootentry.Decode(name, strings.NewReader(string(raw[name])))
		if errors.Is(err, bootentry.ErrNotEntry) {
			strays = append(strays, name)
			continue
		}
		if err != nil {
			return nil, nil, &BootedError{partName(esp), err}
		}
		entries = append(entries, e)
		files[e] = name
	}
	isChanged := func(p gpt.Partition) bool {
		return slices.ContainsFunc(changed, func(c gpt.Partition) bool { return c.Number == p.Number })
	}
	if isChanged(esp) {
		// The entries first: they say which root hash each slot is held to.
		c, u, err := checkEntries(esp, slots, entries, files, raw)
		if err != nil {
			return nil, nil, err
		}
		checked, unchecked = append(checked, c...), append(unchecked, u...)
		for _, n := range strays {
			unchecked = append(unchecked, fmt.Sprintf("%s: %s: not a boot loader entry (no %s): the boot loader skips it", partName(esp), human.Quote("/"+bootentry.Dir+"/"+n), bootentry.Suffix))
		}
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
			c, u, err := checkSlot(ctx, path, *usr, *hash, isChanged, append(slices.Clone(entries), ukis...))
			if err != nil {
				return nil, nil, err
			}
			checked, unchecked = append(checked, c...), append(unchecked, u...)
		}
	}
	if isChanged(esp) {
		var rec *contract.BootRecord
		if slots != nil {
			rec = slots.Boot
		}
		c, err := checkBootFiles(path, l, esp, entries, rec)
		if err != nil {
			return nil, nil, err
		}
		checked = append(checked, c...)
		unchecked = append(unchecked, partName(esp)+": its other files (the boot loader's own, its random seed): the boot loader writes the ESP")
	}
	return checked, unchecked, nil
}

// checkEntries holds every entry on the ESP to what wrote it: the factory's
// (kiln.json records their IDs) byte for byte, and to the slot and root
// hash kiln.json records; the node's as the node writes them.
func checkEntries(esp gpt.Partition, slots *contract.OSSlots, entries []*bootentry.Entry, files map[*bootentry.Entry]string, raw map[string][]byte) (checked, unchecked []string, err error) {
	if len(entries) == 0 {
		return nil, nil, nil
	}
	fail := func(e *bootentry.Entry, format string, a ...any) error {
		return &BootedError{partName(esp), fmt.Errorf("%s: "+format, append([]any{human.Quote("/" + bootentry.Dir + "/" + files[e])}, a...)...)}
	}
	if slots == nil || slots.Boot == nil {
		var names []string
		for _, e := range entries {
			names = append(names, human.Quote(files[e]))
		}
		return nil, []string{fmt.Sprintf("%s: boot loader entries %s: this disk's kiln.json records none of the factory's entries (built by a kiln before it did), so their bytes and kernel command lines are not checked; a disk built by this kiln has them checked", partName(esp), strings.Join(names, ", "))}, nil
	}
	active := slots.ActiveSlot()
	var factory, node []string
	for _, e := range entries {
		b := raw[files[e]]
		want, ok := slots.Boot.Entries[e.ID]
		if !ok {
			// Not the factory's: the node's, which writes each field once,
			// in Encode's order, and boots only files by digest.
			var enc strings.Builder
			if err := e.Encode(&enc); err != nil || enc.String() != string(b) {
				return nil, nil, fail(e, "not the factory's (kiln.json records no entry %s) and not as the node writes entries (each field once, in its order, nothing else): edited; reflash the disk", human.Quote(e.ID))
			}
			for _, p := range append([]string{e.Linux}, e.Initrd...) {
				if !strings.HasPrefix(p, "/"+bootentry.FileDir+"/") {
					return nil, nil, fail(e, "not the factory's (kiln.json records no entry %s), and boots %s, where the node boots only files under /%s named by their sha256: edited; reflash the disk", human.Quote(e.ID), human.Quote(p), bootentry.FileDir)
				}
			}
			node = append(node, human.Quote(files[e]))
			continue
		}
		if u, mounts, err := bootentry.ParseUsrVerity(e.Options); err == nil && mounts &&
			(u.RootHash != slots.RootHash || u.DataPartUUID != active.Usr.PartUUID || u.HashPartUUID != active.UsrVerity.PartUUID) {
			return nil, nil, fail(e, "boots /usr from PARTUUID %s (hash tree %s) with root hash %s, where kiln.json records that the factory's entries boot slot %s (%s, PARTUUID %s) with root hash %s: edited; reflash the disk",
				human.Quote(u.DataPartUUID), human.Quote(u.HashPartUUID), human.Quote(u.RootHash), slots.Active, active.Usr.Name, active.Usr.PartUUID, slots.RootHash)
		}
		if got := digest.FromBytes(b).String(); got != want {
			return nil, nil, fail(e, "its bytes (%s) are not the ones the factory wrote for entry %s (kiln.json records %s): edited or damaged; reflash the disk", got, e.ID, want)
		}
		factory = append(factory, human.Quote(files[e]))
	}
	if len(factory) > 0 {
		checked = append(checked, fmt.Sprintf("%s: boot loader entries %s, byte for byte as the factory wrote them (kiln.json)", partName(esp), strings.Join(factory, ", ")))
	}
	if len(node) > 0 {
		unchecked = append(unchecked, fmt.Sprintf("%s: the kernel command line of boot loader entries %s: the node wrote them from a signed bundle and keeps its record of them on the writable root; they are as the node writes entries, the slot each boots is checked through dm-verity against the root hash it names, its kernel and initramfs by digest", partName(esp), strings.Join(node, ", ")))
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
			return nil, nil, &BootedError{"boot loader entry " + human.Quote(e.ID), err}
		}
		if !ok || u.DataPartUUID != strings.ToLower(usr.GUID) {
			continue
		}
		if u.HashPartUUID != strings.ToLower(hash.GUID) {
			return nil, nil, &BootedError{"boot loader entry " + human.Quote(e.ID), fmt.Errorf("mounts %s with the hash tree of PARTUUID %s, not its own %s: the node never writes such an entry", partName(usr), human.Quote(u.HashPartUUID), partName(hash))}
		}
		if rootHash != "" && u.RootHash != rootHash {
			return nil, nil, &BootedError{part, fmt.Errorf("entries %s and %s boot it with different root hashes: the node keeps one release per slot", human.Quote(boots[0].ID), human.Quote(e.ID))}
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
		return nil, nil, &BootedError{part, fmt.Errorf("fails dm-verity against root hash %s, with which %s boots it: %w; the node would stop at this slot's first bad block: reflash the disk", human.Quote(rootHash), entryNames(boots), err)}
	}
	return []string{fmt.Sprintf("%s: every block through dm-verity (root hash %s, as %s boots it)", part, human.Quote(rootHash), entryNames(boots))}, nil, nil
}

// entryNames is "entry kiln-1.1.0 (version 1.1)" for each entry: the
// entry's own version line, which is the OS's (the vendor's base entry's).
func entryNames(es []*bootentry.Entry) string {
	var s []string
	for _, e := range es {
		n := "entry " + human.Quote(e.ID)
		if e.Version != "" {
			n += " (version " + human.Quote(e.Version) + ")"
		}
		s = append(s, n)
	}
	return strings.Join(s, ", ")
}

// checkBootFiles checks every file the entries name under bootentry.FileDir
// against the sha256 it is named by, and the factory's kernel and initramfs
// (rec: nil on a disk built before kiln recorded them) against kiln.json.
func checkBootFiles(disk string, l *gpt.Layout, esp gpt.Partition, entries []*bootentry.Entry, rec *contract.BootRecord) ([]string, error) {
	named := map[string]bool{}
	var paths []string
	for _, e := range entries {
		for _, p := range append([]string{e.Linux}, e.Initrd...) {
			named[p] = true
			if strings.HasPrefix(p, "/"+bootentry.FileDir+"/") && !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	var checked []string
	if len(paths) > 0 {
		digests, err := espDigests(base.InPlace(disk, l), paths)
		if err != nil {
			return nil, &BootedError{partName(esp), err}
		}
		for i, p := range paths {
			if got := digest.Digest(digests[i]).Encoded(); got != path.Base(p) {
				return nil, &BootedError{partName(esp), fmt.Errorf("%s holds bytes whose sha256 is %s: damaged; the node checks it only as it copies it, so reflash the disk", human.Quote(p), got)}
			}
		}
		checked = append(checked, fmt.Sprintf("%s: the %d kernel and initramfs files the entries name under /%s, each against the sha256 it is named by", partName(esp), len(paths), bootentry.FileDir))
	}
	if rec == nil || len(rec.Files) == 0 {
		return checked, nil
	}
	// The factory's own: the node removes them once no entry boots them.
	var factory []string
	for _, p := range slices.Sorted(maps.Keys(rec.Files)) {
		if named[p] {
			factory = append(factory, p)
		}
	}
	if len(factory) == 0 {
		return checked, nil
	}
	digests, err := espDigests(base.InPlace(disk, l), factory)
	if err != nil {
		return nil, &BootedError{partName(esp), err}
	}
	for i, p := range factory {
		if digests[i] != rec.Files[p] {
			return nil, &BootedError{partName(esp), fmt.Errorf("%s holds bytes whose digest is %s, where kiln.json records the factory's %s: edited or damaged; reflash the disk", p, digests[i], rec.Files[p])}
		}
	}
	return append(checked, fmt.Sprintf("%s: the factory's kernel and initramfs %s, byte for byte as kiln.json records them", partName(esp), strings.Join(factory, ", "))), nil
}

// espDigests is the sha256 ("sha256:HEX") of each file at paths on d's ESP.
func espDigests(d *base.Disk, paths []string) ([]string, error) {
	dir, err := os.MkdirTemp(d.TempDir, "kiln-boot-files-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var out []string
	for i, p := range paths {
		// One directory each: two files may share a base name.
		sub := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(sub, 0o700); err != nil {
			return nil, err
		}
		c, err := CopyFromESP(d, sub, []string{p})
		if err != nil {
			return nil, err
		}
		dg, _, err := filedigest.Of(c[0])
		if err != nil {
			return nil, err
		}
		out = append(out, dg)
	}
	return out, nil
}

// RecordBoot is what the factory put on d's ESP for the boot loader: every
// boot loader entry's bytes by ID, and every kernel and initramfs the
// entries name, by sha256 (kiln.json's OSSlots.Boot).
func RecordBoot(d *base.Disk) (*contract.BootRecord, error) {
	esp, err := FindESP(d.Layout)
	if err != nil {
		return nil, err
	}
	raw, err := readEntries(d, esp)
	if err != nil {
		return nil, err
	}
	rec := &contract.BootRecord{Entries: map[string]string{}, Files: map[string]string{}}
	var paths []string
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		e, err := bootentry.Decode(name, strings.NewReader(string(raw[name])))
		if errors.Is(err, bootentry.ErrNotEntry) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("the base's ESP: %w", err)
		}
		if err := bootentry.CheckID(e.ID); err != nil {
			return nil, fmt.Errorf("the base's ESP: %s: %w", human.Quote(bootentry.Dir+"/"+name), err)
		}
		if _, dup := rec.Entries[e.ID]; dup {
			return nil, fmt.Errorf("the base's ESP holds two files of boot loader entry %s (%s): keep one", e.ID, bootentry.Dir)
		}
		rec.Entries[e.ID] = digest.FromBytes(raw[name]).String()
		for _, p := range append([]string{e.Linux}, e.Initrd...) {
			if !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	for _, p := range paths {
		dg, err := espDigests(d, []string{p})
		var missing notOnESPError
		if errors.As(err, &missing) {
			continue // the base's to boot; nothing of it to record
		}
		if err != nil {
			return nil, err
		}
		rec.Files[p] = dg[0]
	}
	return rec, rec.Check()
}

func partName(p gpt.Partition) string { return fmt.Sprintf("partition %d (%s)", p.Number, p.Name) }
