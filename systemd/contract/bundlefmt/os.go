package bundlefmt

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
	"github.com/opencontainers/go-digest"
)

// OSBlobDir holds the OS section's files in the bundle's filesystem, each
// named by its sha256 (as OCI blobs are): slot indexes, the pack, kernels and
// initramfs images. Two references to the same bytes are one file.
const OSBlobDir = "os/sha256"

// OSFile is the path of the OS section's file with digest d.
func OSFile(d string) string { return OSBlobDir + "/" + strings.TrimPrefix(d, "sha256:") }

// OS is the release's OS in A/B slots (schema 3 on): what a node writes into
// its inactive slot, and the boot loader entry that boots it. A release
// whose base has no OS slots has none, and its bundle is schema 2.
type OS struct {
	Usr   UsrSlot   `json:"usr"`
	Entry BootEntry `json:"entry"`
	// UKIs are, for a recipe with secureBoot, the release's entry as
	// signed unified kernel images (files of the bundle, OSFile): the
	// signed command line names the slot's partitions and the image
	// partition's root hash, so there is one for each slot and each
	// image partition the bundle applies to. A Secure Boot node takes the
	// one for its inactive slot and its image partition, and refuses a
	// bundle without one.
	UKIs []UKIFile `json:"ukis,omitempty"`
}

// UKIFile is a signed unified kernel image of the release's entry.
type UKIFile struct {
	Slot string `json:"slot"` // the slot it mounts /usr from (contract.SlotA, SlotB)
	// ImagesRootHash is the image partition's dm-verity root hash its
	// command line carries (contract.ImagesRootHashParam).
	ImagesRootHash string `json:"imagesRootHash"`
	Digest         string `json:"digest"`
	Size           int64  `json:"size"`
}

// UKI is the unified kernel image for slot and the image partition with
// root hash images; false when the bundle has none.
func (o *OS) UKI(slot, images string) (UKIFile, bool) {
	for _, u := range o.UKIs {
		if u.Slot == slot && u.ImagesRootHash == images {
			return u, true
		}
	}
	return UKIFile{}, false
}

// UsrSlot is the release's /usr slot image: its chunks, its dm-verity
// values, and the chunks its bases lack.
type UsrSlot struct {
	// Index is the digest of the image's slot.Index (a file, OSFile).
	Index string `json:"index"`
	// Size is the image's bytes: the index's, and Verity.DataBlocks 4 KiB
	// blocks.
	Size int64 `json:"size"`
	// Verity is how the factory formatted the slot's hash partition: the
	// node formats its own with these values (slotwrite.Seal), and the root
	// hash must come out as this one. The hash tree never travels.
	Verity slot.Verity `json:"verity"`
	// Pack is the file of the chunks the bases lack (slot.LackingAny over
	// Bases' indexes, in that order); nil when every base holds every chunk
	// (the slot did not change).
	Pack *PackFile `json:"pack,omitempty"`
	// Bases are, for a delta, what each base release's active usr slot
	// holds, one for each of AppliesTo and in its order.
	Bases []SlotBase `json:"bases,omitempty"`
}

// PackFile is a file of the OS section: its digest and size.
type PackFile struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// SlotBase is a base release's active usr slot.
type SlotBase struct {
	contract.ReleaseID
	// Index is the digest of its slot.Index (a file, OSFile), or "" when
	// the factory could not know what it holds (from a kiln.json of a
	// release whose slot differs): the pack then carries every chunk.
	Index string `json:"index,omitempty"`
}

// BootEntry is the release's boot loader entry (bootentry.Entry), but for
// what only the node knows: the entry's ID and file name, where the kernel
// goes on its ESP, and which slot's partitions it mounts.
type BootEntry struct {
	Title   string     `json:"title,omitempty"`
	Version string     `json:"version"` // systemd-boot boots the highest first
	Kernel  BootFile   `json:"kernel"`
	Initrd  []BootFile `json:"initrd,omitempty"`
	// Options is the kernel command line without the parameters that mount
	// /usr from a slot (bootentry.UsrVerity.Options), which the node adds
	// for the slot it wrote, with Usr.Verity's root hash.
	Options []string `json:"options"`
	// UsrFSType is the slot image's filesystem (mount.usrfstype=).
	UsrFSType string `json:"usrFSType"`
}

// BootFile is a kernel or initramfs of the entry.
type BootFile struct {
	Name   string `json:"name"` // its file name on the base's ESP, e.g. "vmlinuz"
	Size   int64  `json:"size"`
	Digest string `json:"digest"`
	// OnStick: it is a file of the bundle (OSFile). A delta leaves it out
	// when every base's entry boots this very file, and the node copies its
	// own.
	OnStick bool `json:"onStick"`
}

// anyPartUUID stands for the node's partitions when the entry is checked.
const anyPartUUID = "00000000-0000-4000-8000-000000000000"

// usrVerityKeys are the parameters bootentry.UsrVerity.Options writes.
var usrVerityKeys = []string{"mount.usr", "mount.usrfstype", "mount.usrflags", "usrhash", "systemd.verity_usr_data", "systemd.verity_usr_hash"}

// IsUsrVerityOption says whether a kernel parameter is one the node writes
// for the slot it boots (the factory leaves them out of Options).
func IsUsrVerityOption(o string) bool {
	k, _, _ := strings.Cut(o, "=")
	return slices.Contains(usrVerityKeys, k)
}

// validateOS adds what is wrong with the OS section to bad: everything
// that can be told from the manifest alone (CheckOS reads the indexes).
func (m *Manifest) validateOS(bad func(string, ...any)) {
	o := m.OS
	if o == nil {
		return
	}
	if m.SchemaVersion < OSSchemaVersion {
		bad("schema %d has no os section (schema %d on)", m.SchemaVersion, OSSchemaVersion)
	}
	files := map[string]File{}
	for _, f := range m.Files {
		files[f.Path] = f
	}
	file := func(what, d string, size int64) {
		switch f, ok := files[OSFile(d)]; {
		case !isSHA256(d):
			bad("os: %s %q is not a sha256 digest", what, d)
		case !ok:
			bad("os: %s %s is not a file of the bundle (%s)", what, d, OSFile(d))
		case f.Digest != d || (size >= 0 && f.Size != size):
			bad("os: %s %s (%d bytes) is not the file %s (%s, %d bytes)", what, d, size, f.Path, f.Digest, f.Size)
		}
	}
	u := o.Usr
	file("usr slot index", u.Index, -1)
	if err := u.Verity.Check(); err != nil {
		bad("os: usr %v", err)
	}
	if u.Size <= 0 || u.Size != u.Verity.DataBlocks*slot.VerityBlock {
		bad("os: usr slot image of %d bytes, dm-verity over %d blocks of %d: they must agree", u.Size, u.Verity.DataBlocks, slot.VerityBlock)
	}
	if u.Pack != nil {
		if u.Pack.Size <= 0 {
			bad("os: an empty pack is left out, not listed")
		}
		file("usr slot pack", u.Pack.Digest, u.Pack.Size)
	}
	var bases []contract.ReleaseID
	for _, b := range u.Bases {
		bases = append(bases, b.ReleaseID)
		if b.Index != "" {
			file("usr slot index of base "+b.Version, b.Index, -1)
		}
	}
	if !slices.Equal(bases, m.AppliesTo) {
		bad("os: the usr slot's bases %v are not the releases the bundle applies to %v", bases, m.AppliesTo)
	}
	for _, k := range o.UKIs {
		file("unified kernel image for slot "+k.Slot, k.Digest, k.Size)
		if k.Slot != contract.SlotA && k.Slot != contract.SlotB || !isHex64(k.ImagesRootHash) {
			bad("os: unified kernel image %s: slot %q, image partition root hash %q", k.Digest, k.Slot, k.ImagesRootHash)
		}
	}
	e := o.Entry
	if e.Version == "" {
		bad("os: the boot entry has no version")
	}
	paths := []string{}
	for _, f := range append([]BootFile{e.Kernel}, e.Initrd...) {
		paths = append(paths, "/"+f.Name)
		switch {
		case f.Name == "" || strings.ContainsAny(f.Name, "/\\ \t\n") || f.Name == "." || f.Name == "..":
			bad("os: boot file name %q: want a plain file name", f.Name)
		case f.OnStick:
			file("boot file "+f.Name, f.Digest, f.Size)
		case m.Kind == KindFull:
			bad("os: a full bundle must carry boot file %s", f.Name)
		case !isSHA256(f.Digest) || f.Size <= 0:
			bad("os: boot file %s: digest %q, %d bytes", f.Name, f.Digest, f.Size)
		}
	}
	for _, opt := range e.Options {
		if IsUsrVerityOption(opt) {
			bad("os: the boot entry's options name %q, which the node writes for the slot it boots", opt)
		}
	}
	usr, err := bootentry.UsrVerity{RootHash: u.Verity.RootHash, DataPartUUID: anyPartUUID, HashPartUUID: anyPartUUID, FSType: e.UsrFSType}.Options()
	if err != nil {
		bad("os: the boot entry: %v", err)
		return
	}
	entry := bootentry.Entry{ID: "kiln", Title: e.Title, Version: e.Version, Linux: paths[0], Initrd: paths[1:], Options: append(slices.Clone(e.Options), usr...)}
	if err := entry.Check(); err != nil {
		bad("os: %v", err)
	}
}

// ReadSlotIndex reads the slot index with digest d from the bundle's
// filesystem (at fsOffset in r), checking it against d before decoding it.
func (m *Manifest) ReadSlotIndex(r io.ReaderAt, fsOffset int64, d string) (*slot.Index, error) {
	i := slices.IndexFunc(m.Files, func(f File) bool { return f.Path == OSFile(d) })
	if i < 0 {
		return nil, fmt.Errorf("%w: slot index %s is not a file of the bundle", ErrDamaged, d)
	}
	f := m.Files[i]
	// Decode reads no more than its header bounds; the rest is hashed
	// (streamed, never held) so that a damaged index is named as such.
	h := sha256.New()
	sr := io.NewSectionReader(r, fsOffset+f.Offset, f.Size)
	x, decodeErr := slot.Decode(io.TeeReader(sr, h))
	if _, err := io.Copy(h, sr); err != nil {
		return nil, fmt.Errorf("read slot index %s: %w", f.Path, err)
	}
	if digest.NewDigest(digest.SHA256, h).String() != d {
		return nil, fmt.Errorf("%w: slot index %s (bytes %d-%d of the filesystem) differs from the signed manifest", ErrDamaged, f.Path, f.Offset, f.Offset+f.Size-1)
	}
	if decodeErr != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrDamaged, f.Path, decodeErr)
	}
	return x, nil
}

// CheckOS checks what Validate cannot from the manifest alone: the usr slot
// index (read from the filesystem at fsOffset in r) describes an image of
// Usr.Size bytes, and the pack is exactly the chunks the bases' indexes lack.
// It returns the index and the bases' (in Usr.Bases' order, nil where not
// known): what the pack was cut against (slotwrite.Source.PackBases). The
// pack's bytes are checked chunk by chunk as the node writes them, and whole
// by CheckFilesystem.
func (m *Manifest) CheckOS(r io.ReaderAt, fsOffset int64) (*slot.Index, []*slot.Index, error) {
	if m.OS == nil {
		return nil, nil, errors.New("the bundle has no OS section")
	}
	u := m.OS.Usr
	x, err := m.ReadSlotIndex(r, fsOffset, u.Index)
	if err != nil {
		return nil, nil, err
	}
	if x.Size != u.Size {
		return nil, nil, fmt.Errorf("%w: the usr slot index describes %d bytes, the manifest says %d", ErrDamaged, x.Size, u.Size)
	}
	var bases []*slot.Index
	for _, b := range u.Bases {
		var bx *slot.Index
		if b.Index != "" {
			if bx, err = m.ReadSlotIndex(r, fsOffset, b.Index); err != nil {
				return nil, nil, err
			}
		}
		bases = append(bases, bx)
	}
	want := slot.PackSize(slot.LackingAny(x, bases...))
	got := int64(0)
	if u.Pack != nil {
		got = u.Pack.Size
	}
	if got != want {
		return nil, nil, fmt.Errorf("%w: the usr slot pack is %d bytes, the chunks its bases lack are %d", ErrDamaged, got, want)
	}
	return x, bases, nil
}

// isHex64 says s is a sha256 in lower-case hex (a dm-verity root hash).
func isHex64(s string) bool { return isSHA256("sha256:"+s) && strings.ToLower(s) == s }
