// Package osslots finds a base disk's OS slots (issue 23): its usr and
// usr-verity partitions by their Discoverable Partitions Specification
// types, paired into slots A and B, and the slot its release boots, as the
// boot loader entries on its ESP name it (usrhash=, read with mtools,
// without mounting). The base's partition table is the source of truth: a
// recipe does not declare slots.
package osslots

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/internal/hosttools"
	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// ESPType is the EFI system partition's type GUID.
const ESPType = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"

// Read returns the OS slots of the base image d: nil when it has no usr
// partition. A base that has some but cannot be upgraded slot by slot is an
// error that names the partitions and what is wrong. A compressed base's
// ESP is copied out (base.Disk.PartitionFile) to be read.
func Read(d *base.Disk) (*contract.OSSlots, error) {
	s, _, err := ReadBoot(d)
	return s, err
}

// ReadBoot is Read, and the boot loader entry of the base's release (the
// one OSSlots.Entry names).
func ReadBoot(d *base.Disk) (*contract.OSSlots, *bootentry.Entry, error) {
	s, err := FromLayout(d.Layout)
	if s == nil || err != nil {
		return nil, nil, err
	}
	esp, err := FindESP(d.Layout)
	if err != nil {
		return nil, nil, err
	}
	entries, err := readEntries(d, esp)
	if err != nil {
		return nil, nil, err
	}
	e, err := activate(s, entries, esp)
	if err != nil {
		return nil, nil, err
	}
	return s, e, s.Check()
}

// FromLayout pairs the usr and usr-verity partitions of l into slots A and B
// (A the first usr partition on the disk); the active slot is left for the
// boot loader entries to say. nil when l has no usr partition.
func FromLayout(l *gpt.Layout) (*contract.OSSlots, error) {
	var usr, verity []gpt.Partition
	arch := ""
	for _, p := range l.Partitions {
		for a, t := range contract.UsrPartTypes {
			switch p.Type {
			case t:
				usr = append(usr, p)
			case contract.UsrVerityPartTypes[a]:
				verity = append(verity, p)
			default:
				continue
			}
			if arch != "" && arch != a {
				return nil, fmt.Errorf("the base's usr partitions are for both %s and %s (partition %d %q): an OS is for one", arch, a, p.Number, p.Name)
			}
			arch = a
		}
	}
	if len(usr) == 0 && len(verity) == 0 {
		return nil, nil
	}
	if len(usr) != 2 {
		return nil, fmt.Errorf("the base has %d usr partitions (%s), where A/B slots are two: give it two (B no smaller than A), or none (no OS upgrades)",
			len(usr), names(usr))
	}
	s := &contract.OSSlots{Arch: arch}
	used := map[int]bool{}
	for i, u := range usr {
		v, err := verityOf(u, i, usr, verity)
		if err != nil {
			return nil, err
		}
		if used[v.Number] {
			return nil, fmt.Errorf("usr partitions %d %q and %d %q would share the usr-verity partition %d %q: each slot needs its own",
				usr[0].Number, usr[0].Name, usr[1].Number, usr[1].Name, v.Number, v.Name)
		}
		used[v.Number] = true
		s.Slots[i] = contract.OSSlot{Name: []string{contract.SlotA, contract.SlotB}[i], Usr: slotPart(u), UsrVerity: slotPart(v)}
	}
	for _, v := range verity {
		if !used[v.Number] {
			return nil, fmt.Errorf("the base's usr-verity partition %d %q belongs to no usr partition (usr partitions: %s)", v.Number, v.Name, names(usr))
		}
	}
	return s, nil
}

// verityOf is usr's verity partition: the one named after it ("usr-a" →
// "usr-a-verity"), else the one in the same place among the verity
// partitions as usr among the usr partitions.
func verityOf(u gpt.Partition, i int, usr, verity []gpt.Partition) (gpt.Partition, error) {
	for _, v := range verity {
		if u.Name != "" && v.Name == u.Name+"-verity" {
			return v, nil
		}
	}
	if len(verity) != len(usr) {
		return gpt.Partition{}, fmt.Errorf("usr partition %d %q has no usr-verity partition (its dm-verity hash tree, e.g. named %q): the base has %d usr-verity partitions (%s) for %d usr partitions",
			u.Number, u.Name, u.Name+"-verity", len(verity), names(verity), len(usr))
	}
	return verity[i], nil
}

func slotPart(p gpt.Partition) contract.SlotPartition {
	return contract.SlotPartition{Name: p.Name, PartUUID: strings.ToLower(p.GUID), Size: p.Size}
}

func names(ps []gpt.Partition) string {
	if len(ps) == 0 {
		return "none"
	}
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%d %q", p.Number, p.Name))
	}
	return strings.Join(s, ", ")
}

// FindESP returns the layout's one EFI system partition, where the boot
// loader entries that name the slots are.
func FindESP(l *gpt.Layout) (gpt.Partition, error) {
	var esps []gpt.Partition
	for _, p := range l.Partitions {
		if p.Type == ESPType {
			esps = append(esps, p)
		}
	}
	if len(esps) != 1 {
		return gpt.Partition{}, fmt.Errorf("the base has usr slots and %d EFI system partitions (%s): its boot loader entries must be on one, which names the slot its release boots",
			len(esps), names(esps))
	}
	return esps[0], nil
}

// activate sets the slot the base's release boots, from the entries that
// mount a slot: they must all boot the same slot with the same root hash
// (a base is one release), and one of them, the release's, has a version
// (the others are e.g. a first-boot variant of it). It returns the release's
// entry.
func activate(s *contract.OSSlots, entries map[string][]byte, esp gpt.Partition) (*bootentry.Entry, error) {
	var booting, release []string // IDs of the entries that mount a slot, of those with a version
	byID := map[string]*bootentry.Entry{}
	var usr *bootentry.UsrVerity
	var first string
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		e, err := bootentry.Decode(name, strings.NewReader(string(entries[name])))
		if errors.Is(err, bootentry.ErrNotEntry) {
			continue
		}
		if err != nil {
			return nil, err
		}
		u, ok, err := bootentry.ParseUsrVerity(e.Options)
		if err != nil {
			return nil, fmt.Errorf("boot loader entry %s on the ESP: %w", name, err)
		}
		if !ok {
			continue
		}
		if usr != nil && (u.RootHash != usr.RootHash || u.DataPartUUID != usr.DataPartUUID || u.HashPartUUID != usr.HashPartUUID) {
			return nil, fmt.Errorf("boot loader entries %s and %s boot different /usr (usrhash=, systemd.verity_usr_data=, systemd.verity_usr_hash=): a base is one release, and one slot", first, name)
		}
		if usr == nil {
			usr, first = &u, name
		}
		booting = append(booting, e.ID)
		byID[e.ID] = e
		if e.Version != "" {
			release = append(release, e.ID)
		}
	}
	if usr == nil {
		return nil, fmt.Errorf("the base has usr slots but no boot loader entry in %s on its ESP (partition %d %q) mounts one (usrhash=, systemd.verity_usr_data=PARTUUID=, systemd.verity_usr_hash=PARTUUID=)",
			bootentry.Dir, esp.Number, esp.Name)
	}
	switch {
	case len(release) == 1:
		s.Entry = release[0]
	case len(release) > 1:
		return nil, fmt.Errorf("boot loader entries %s all have a version: a base is one release, whose entry is the one with a version", strings.Join(release, ", "))
	case len(booting) == 1:
		s.Entry = booting[0]
	default:
		return nil, fmt.Errorf("none of the boot loader entries %s has a version: the release's entry needs one (systemd-boot boots the highest version first)", strings.Join(booting, ", "))
	}
	for i, sl := range s.Slots {
		if sl.Usr.PartUUID != usr.DataPartUUID {
			continue
		}
		if sl.UsrVerity.PartUUID != usr.HashPartUUID {
			return nil, fmt.Errorf("boot loader entry %s mounts %q (PARTUUID %s) with the hash tree of PARTUUID %s, not its own %q (%s)",
				s.Entry, sl.Usr.Name, sl.Usr.PartUUID, usr.HashPartUUID, sl.UsrVerity.Name, sl.UsrVerity.PartUUID)
		}
		s.Active, s.RootHash = []string{contract.SlotA, contract.SlotB}[i], usr.RootHash
		return byID[s.Entry], nil
	}
	return nil, fmt.Errorf("boot loader entry %s mounts /usr from PARTUUID %s, which is neither slot's usr partition (%q %s, %q %s)",
		s.Entry, usr.DataPartUUID, s.Slots[0].Usr.Name, s.Slots[0].Usr.PartUUID, s.Slots[1].Usr.Name, s.Slots[1].Usr.PartUUID)
}

// readEntries reads every file of the ESP's loader/entries with mtools,
// from the disk file itself when the base is raw (mtools' "@@offset"), from
// a copy of the ESP's bytes when it is compressed.
func readEntries(d *base.Disk, esp gpt.Partition) (map[string][]byte, error) {
	img, err := espImage(d, esp)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(d.TempDir, "kiln-esp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("mcopy", "-s", "-n", "-i", img, "::/"+bootentry.Dir, dir)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, hosttools.RunError("read the base's boot loader entries", err, nil)
		}
		return nil, fmt.Errorf("the base has usr slots, but its ESP (partition %d %q) has no readable %s, where the entry that boots a slot must be: mcopy: %s",
			esp.Number, esp.Name, bootentry.Dir, strings.TrimSpace(string(out)))
	}
	found, err := os.ReadDir(filepath.Join(dir, filepath.Base(bootentry.Dir)))
	if err != nil {
		return nil, err
	}
	entries := map[string][]byte{}
	for _, f := range found {
		if !f.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, filepath.Base(bootentry.Dir), f.Name()))
		if err != nil {
			return nil, err
		}
		entries[f.Name()] = b
	}
	return entries, nil
}

// CopyFromESP copies the files at paths on the base's ESP (absolute, as a
// boot loader entry names them: "/kiln/1.0/vmlinuz") into dst, each under
// its base name, with mtools as readEntries reads; it returns the copies'
// paths in the order of paths. The base names must differ.
func CopyFromESP(d *base.Disk, dst string, paths []string) ([]string, error) {
	esp, err := FindESP(d.Layout)
	if err != nil {
		return nil, err
	}
	img, err := espImage(d, esp)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range paths {
		local := filepath.Join(dst, filepath.Base(p))
		if slices.Contains(out, local) {
			return nil, fmt.Errorf("the boot loader entry names two files called %s", filepath.Base(p))
		}
		cmd := exec.Command("mcopy", "-n", "-i", img, "::"+p, local)
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		if b, err := cmd.CombinedOutput(); err != nil {
			if errors.Is(err, exec.ErrNotFound) {
				return nil, hosttools.RunError("read the base's ESP", err, nil)
			}
			return nil, notOnESPError{fmt.Errorf("the base's boot loader entry names %s, which its ESP (partition %d %q) does not hold: mcopy: %s",
				p, esp.Number, esp.Name, strings.TrimSpace(string(b)))}
		}
		out = append(out, local)
	}
	return out, nil
}

// notOnESPError: CopyFromESP found no file at a path.
type notOnESPError struct{ error }

func (e notOnESPError) Unwrap() error { return e.error }

// espImage is what mtools reads the ESP from: the disk file at the ESP's
// offset ("@@offset") when raw, else the disk's copy of it.
func espImage(d *base.Disk, esp gpt.Partition) (string, error) {
	f, off, err := d.PartitionFile(esp)
	if err != nil {
		return "", fmt.Errorf("read the base's ESP: %w", err)
	}
	if !d.Raw {
		return f, nil
	}
	return fmt.Sprintf("%s@@%d", f, off), nil
}

// CheckArch refuses slots (nil: none) that are not for arch, the recipe's:
// their usr partition types say which arch they are for. A build and a
// bundle ask the same.
func CheckArch(s *contract.OSSlots, arch string) error {
	if s != nil && s.Arch != arch {
		return fmt.Errorf("its OS slots are for %s (usr partition types), the recipe's arch is %s", s.Arch, arch)
	}
	return nil
}
