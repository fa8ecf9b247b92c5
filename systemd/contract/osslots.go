package contract

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// Partition types of the Discoverable Partitions Specification that make a
// base's OS slots: each slot is a usr partition and its usr-verity
// partition (the dm-verity hash tree), by GOARCH.
var (
	UsrPartTypes = map[string]string{
		"amd64": "8484680C-9521-48C6-9C11-B0720656F69E",
		"arm64": "B0E01050-EE5F-4390-949A-9101B17104E9",
	}
	UsrVerityPartTypes = map[string]string{
		"amd64": "77FF5F63-E7B6-4633-ACF4-1565B864C0E6",
		"arm64": "6E11A4E7-FBCA-4DED-B9E9-E1A512BB664E",
	}
)

// Slot names, in disk order: A is the first usr partition on the disk.
const (
	SlotA = "a"
	SlotB = "b"
)

// OSSlots is the appliance's OS in A/B slots as the node needs it: both
// slots' partitions by PARTUUID, and which slot the factory's release boots.
// The base's partition table is its source (usr and usr-verity partitions
// by type), the base's boot loader entry names the active slot and its root
// hash; kiln.json carries it. A base without usr partitions has none, and
// its kiln.json no osSlots at all.
type OSSlots struct {
	Arch  string    `json:"arch"`  // GOARCH of the usr partition types
	Slots [2]OSSlot `json:"slots"` // A, then B
	// Active is the slot the factory's release boots (SlotA or SlotB).
	Active string `json:"active"`
	// Entry is the ID of that release's boot loader entry (bootentry.Entry.ID).
	Entry string `json:"entry"`
	// RootHash is the active slot's dm-verity root hash, as its entry
	// names it (usrhash=): hex sha256.
	RootHash string `json:"rootHash"`
	// Boot is what the factory put on the ESP for the boot loader (absent
	// on disks built before kiln recorded it).
	Boot *BootRecord `json:"boot,omitempty"`
}

// BootRecord is the sha256 ("sha256:HEX") of every boot loader entry on the
// factory's ESP, by entry ID (bootentry.Entry.ID: the boot loader renames
// the file as it counts tries, never changes its bytes), and of every
// kernel and initramfs those entries name, by ESP path ("/flatcar/vmlinuz-a").
// `kiln verify --booted` holds the ESP to it byte for byte.
type BootRecord struct {
	Entries map[string]string `json:"entries"`
	Files   map[string]string `json:"files"`
}

// Check says whether every ID can name an entry, every path is absolute
// and every digest is a sha256.
func (r *BootRecord) Check() error {
	for id, d := range r.Entries {
		if err := bootentry.CheckID(id); err != nil {
			return fmt.Errorf("boot record: %w", err)
		}
		if !sha256Digest.MatchString(d) {
			return fmt.Errorf("boot record: entry %s: digest %q is not sha256:HEX", id, d)
		}
	}
	for p, d := range r.Files {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("boot record: file %q is not an absolute ESP path", p)
		}
		if !sha256Digest.MatchString(d) {
			return fmt.Errorf("boot record: file %s: digest %q is not sha256:HEX", p, d)
		}
	}
	return nil
}

// OSSlot is one slot's partitions.
type OSSlot struct {
	Name      string        `json:"name"` // SlotA or SlotB
	Usr       SlotPartition `json:"usr"`
	UsrVerity SlotPartition `json:"usrVerity"`
}

// SlotPartition is a partition of a slot.
type SlotPartition struct {
	Name     string `json:"name"`     // GPT partition name, e.g. "usr-a"
	PartUUID string `json:"partUUID"` // lower case, as /dev/disk/by-partuuid names it
	Size     int64  `json:"size"`     // bytes
}

var (
	lowerUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	rootHash  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// sha256Digest is a digest as kiln writes them ("sha256:HEX").
	sha256Digest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ActiveSlot is the slot the factory's release boots.
func (s *OSSlots) ActiveSlot() OSSlot {
	if s.Active == SlotB {
		return s.Slots[1]
	}
	return s.Slots[0]
}

// Check says whether the slots are usable as they are: A and B, four
// distinct partitions, B at least as large as A (a new release must fit
// where the old one was), an active slot with its entry and root hash.
func (s *OSSlots) Check() error {
	if _, ok := UsrPartTypes[s.Arch]; !ok {
		return fmt.Errorf("OS slots: arch %q (want amd64 or arm64)", s.Arch)
	}
	seen := map[string]string{}
	for i, name := range []string{SlotA, SlotB} {
		sl := s.Slots[i]
		if sl.Name != name {
			return fmt.Errorf("OS slots: slot %d is named %q, want %q", i+1, sl.Name, name)
		}
		for _, p := range []SlotPartition{sl.Usr, sl.UsrVerity} {
			if !lowerUUID.MatchString(p.PartUUID) {
				return fmt.Errorf("OS slot %s: partition %q: PARTUUID %q is not a lower-case UUID", name, p.Name, p.PartUUID)
			}
			if other, dup := seen[p.PartUUID]; dup {
				return fmt.Errorf("OS slot %s: partitions %q and %q have the same PARTUUID %s", name, other, p.Name, p.PartUUID)
			}
			seen[p.PartUUID] = p.Name
			if p.Size <= 0 {
				return fmt.Errorf("OS slot %s: partition %q: size %d", name, p.Name, p.Size)
			}
		}
	}
	a, b := s.Slots[0], s.Slots[1]
	if b.Usr.Size < a.Usr.Size {
		return fmt.Errorf("OS slots: %q (%s) is smaller than %q (%s): slot B must hold any release slot A holds; make %q at least %d bytes",
			b.Usr.Name, human.Bytes(b.Usr.Size), a.Usr.Name, human.Bytes(a.Usr.Size), b.Usr.Name, a.Usr.Size)
	}
	if b.UsrVerity.Size < a.UsrVerity.Size {
		return fmt.Errorf("OS slots: %q (%s) is smaller than %q (%s): slot B's hash tree must fit where A's does; make %q at least %d bytes",
			b.UsrVerity.Name, human.Bytes(b.UsrVerity.Size), a.UsrVerity.Name, human.Bytes(a.UsrVerity.Size), b.UsrVerity.Name, a.UsrVerity.Size)
	}
	if s.Active != SlotA && s.Active != SlotB {
		return fmt.Errorf("OS slots: active slot %q (want %q or %q)", s.Active, SlotA, SlotB)
	}
	if err := bootentry.CheckID(s.Entry); err != nil {
		return fmt.Errorf("OS slots: %w", err)
	}
	if !rootHash.MatchString(s.RootHash) {
		return fmt.Errorf("OS slots: root hash %q is not 64 lower-case hex digits (sha256)", s.RootHash)
	}
	if s.Boot != nil {
		return s.Boot.Check()
	}
	return nil
}
