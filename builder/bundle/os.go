package bundle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/builder/slotcut"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/internal/progress"
	pbase "github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
	"github.com/opencontainers/go-digest"
)

// osRelease is a release's OS as a disk holds it (a vendor's base, or a disk
// kiln built from one): its slots, its release's boot entry, its active usr
// slot cut into chunks and proven against the entry's root hash, and its
// kernel and initramfs copied out.
type osRelease struct {
	slots  *contract.OSSlots
	entry  *bootentry.Entry
	fsType string // the entry's mount.usrfstype=
	verity slot.Verity
	index  *slot.Index
	image  io.ReaderAt // the slot image: verity's data blocks of the active usr partition
	boot   []bootFile  // the kernel, then each initramfs
	closer func()
}

type bootFile struct {
	local  string // the copy
	digest string
	size   int64
}

// readOSRelease reads the OS of the disk at path into dir (a compressed
// disk's partitions are copied out there, in one pass of its
// decompression): nil when it has no OS slots. Reading a slot is a task of
// p, named only when there is one.
func readOSRelease(ctx context.Context, path, dir string, p progress.Reporter) (rel *osRelease, err error) {
	d, err := pbase.OpenDisk(path, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if rel == nil || err != nil {
			d.Close()
		}
	}()
	slots, entry, err := osslots.ReadBoot(d)
	if slots == nil || err != nil {
		return nil, err
	}
	task := p.Task("read the base's OS slot", 0)
	defer func() { task.Done(err) }()
	usr, _, err := bootentry.ParseUsrVerity(entry.Options) // osslots found it mounts the slot
	if err != nil {
		return nil, fmt.Errorf("boot loader entry %s: %w", entry.ID, err)
	}
	rel = &osRelease{slots: slots, entry: entry, fsType: usr.FSType, closer: func() { d.Close() }}
	if err := rel.readActiveSlot(ctx, d); err != nil {
		return nil, err
	}
	bootDir := filepath.Join(dir, "boot")
	if err := os.MkdirAll(bootDir, 0o755); err != nil {
		return nil, err
	}
	copies, err := osslots.CopyFromESP(d, bootDir, append([]string{entry.Linux}, entry.Initrd...))
	if err != nil {
		return nil, err
	}
	for _, c := range copies {
		digest, n, err := filedigest.Of(c)
		if err != nil {
			return nil, err
		}
		rel.boot = append(rel.boot, bootFile{local: c, digest: digest, size: n})
	}
	return rel, nil
}

// readActiveSlot reads r.slots' active usr slot of disk d: proven against
// its root hash (every block), and cut into chunks.
func (r *osRelease) readActiveSlot(ctx context.Context, d *pbase.Disk) error {
	active := r.slots.ActiveSlot()
	data, hash := partition(d.Layout, active.Usr.PartUUID), partition(d.Layout, active.UsrVerity.PartUUID)
	// The ESP is read already; the slot's partitions come next on the disk,
	// so a compressed one is still decompressed once.
	rs, err := d.Partitions(data, hash)
	if err != nil {
		return err
	}
	dataR, hashR := rs[0], rs[1]
	v, err := verity.ReadSlot(ctx, dataR, hashR, r.slots.RootHash)
	if err != nil {
		return fmt.Errorf("slot %s (%q, with %q): %w", active.Name, active.Usr.Name, active.UsrVerity.Name, err)
	}
	if v.DataBlocks*verity.Block > data.Size {
		return fmt.Errorf("the dm-verity superblock of %q says %d data blocks, more than %q holds (%d bytes)", active.UsrVerity.Name, v.DataBlocks, active.Usr.Name, data.Size)
	}
	r.verity = slot.Verity{RootHash: v.RootHash, Salt: v.Salt, UUID: v.UUID, DataBlocks: v.DataBlocks}
	r.image = io.NewSectionReader(dataR, 0, v.DataBlocks*verity.Block)
	if r.index, err = slotcut.Cut(io.NewSectionReader(r.image, 0, v.DataBlocks*verity.Block)); err != nil {
		return fmt.Errorf("cut slot %s: %w", active.Name, err)
	}
	return nil
}

// bootDigests is the set of the release's kernel and initramfs digests.
func (r *osRelease) bootDigests() map[string]bool {
	m := map[string]bool{}
	for _, f := range r.boot {
		m[f.digest] = true
	}
	return m
}

func partition(l *gpt.Layout, partUUID string) gpt.Partition {
	for _, p := range l.Partitions {
		if strings.EqualFold(p.GUID, partUUID) {
			return p
		}
	}
	return gpt.Partition{} // osslots found both by their GUIDs
}

// priorOS is what a prior release's nodes hold of the OS.
type priorOS struct {
	none     bool        // they have no OS slots (their base had none)
	rootHash string      // their active slot's root hash, "" when not known
	index    *slot.Index // what their active usr slot holds, nil when not known
	boot     map[string]bool
}

// osOfRelease is what nodes built from rel hold (nil rel: no slots).
func osOfRelease(rel *osRelease) *priorOS {
	if rel == nil {
		return &priorOS{none: true}
	}
	return &priorOS{rootHash: rel.verity.RootHash, index: rel.index, boot: rel.bootDigests()}
}

// readOS reads the OS of the recipe's base, the new release's: nil when it
// has no slots.
func (b *bundler) readOS(ctx context.Context) error {
	r := b.Recipe
	p := r.Resolve(r.Base.Path)
	dir, err := b.workDir("os")
	if err != nil {
		return err
	}
	rel, err := readOSRelease(ctx, p, dir, b.o.Progress)
	if err != nil {
		return r.Errorf("base.path", "base image %s: %v", p, err)
	}
	if rel == nil {
		return nil
	}
	b.onCleanup(rel.closer)
	if err := osslots.CheckArch(rel.slots, r.Arch); err != nil {
		return r.Errorf("base.path", "base image %s: %v", p, err)
	}
	// The bundle signs what it read of the base: the base the recipe pins,
	// as a build checks it.
	if r.Base.Digest != "" {
		task := b.o.Progress.Task("check the base's digest", 0)
		got, _, err := filedigest.Of(p)
		task.Done(err)
		if err != nil {
			return err
		}
		if !strings.EqualFold(got, r.Base.Digest) {
			return r.Errorf("base.digest", "base image %s has digest %s, but the recipe expects %s; use the right file or fix base.digest", p, got, r.Base.Digest)
		}
	}
	b.os = rel
	return nil
}

// describeOS fills the manifest's OS section but for the pack's digest:
// the slot's index and verity values, what each prior release holds and so the
// pack's size, the boot entry and which of its files the stick carries.
func (b *bundler) describeOS(context.Context) error {
	rel := b.os
	if rel == nil {
		return nil
	}
	x := rel.index
	xd, err := indexDigest(x)
	if err != nil {
		return err
	}
	u := bundlefmt.UsrSlot{Index: xd, Size: x.Size, Verity: rel.verity}
	b.osIndexes = map[string]*slot.Index{xd: x}
	// One SlotBase per release (AppliesTo); of several --from of one
	// release, the one that says most.
	byRelease := map[contract.ReleaseID]*priorOS{}
	for _, prior := range b.priors {
		o := prior.os
		if o == nil {
			o = &priorOS{}
		}
		if o.index == nil && o.rootHash == rel.verity.RootHash {
			o.index = x // the same slot, byte for byte
		}
		if have := byRelease[prior.release]; have == nil || have.index == nil {
			byRelease[prior.release] = o
		}
	}
	var bases []*slot.Index
	for _, id := range b.m.AppliesTo {
		o := byRelease[id]
		sb := bundlefmt.SlotBase{ReleaseID: id}
		if o.index != nil {
			if sb.Index, err = indexDigest(o.index); err != nil {
				return err
			}
			b.osIndexes[sb.Index] = o.index
		}
		u.Bases = append(u.Bases, sb)
		bases = append(bases, o.index)
	}
	b.packPriors = bases
	if n := slot.PackSize(slot.LackingAny(x, bases...)); n > 0 {
		u.Pack = &bundlefmt.PackFile{Size: n} // its digest once written (stageOS)
	}
	e := rel.entry
	entry := bundlefmt.BootEntry{Title: e.Title, Version: e.Version, UsrFSType: rel.fsType}
	for _, o := range e.Options {
		if !bundlefmt.IsUsrVerityOption(o) {
			entry.Options = append(entry.Options, o)
		}
	}
	for i, f := range rel.boot {
		bf := bundlefmt.BootFile{Name: filepath.Base(f.local), Size: f.size, Digest: f.digest, OnStick: len(b.priors) == 0}
		for _, prior := range b.priors {
			bf.OnStick = bf.OnStick || prior.os == nil || !prior.os.boot[f.digest]
		}
		if i == 0 {
			entry.Kernel = bf
		} else {
			entry.Initrd = append(entry.Initrd, bf)
		}
	}
	b.m.OS = &bundlefmt.OS{Usr: u, Entry: entry}
	return nil
}

// osChanges says whether the OS section carries any bytes a prior release lacks.
func (b *bundler) osChanges() bool {
	o := b.m.OS
	if o == nil {
		return false
	}
	if o.Usr.Pack != nil {
		return true
	}
	return slices.ContainsFunc(append([]bundlefmt.BootFile{o.Entry.Kernel}, o.Entry.Initrd...), func(f bundlefmt.BootFile) bool { return f.OnStick })
}

// stageOS writes the OS section's files into the tree, each named by its
// digest: the slot indexes, the pack, the boot files the stick carries.
func (b *bundler) stageOS(context.Context) error {
	o := b.m.OS
	if o == nil {
		return nil
	}
	dir := filepath.Join(b.tree, filepath.FromSlash(bundlefmt.OSBlobDir))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for d, x := range b.osIndexes {
		var buf bytes.Buffer
		if err := x.Encode(&buf); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(b.tree, filepath.FromSlash(bundlefmt.OSFile(d))), buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	for _, f := range append([]bundlefmt.BootFile{o.Entry.Kernel}, o.Entry.Initrd...) {
		if !f.OnStick {
			continue
		}
		i := slices.IndexFunc(b.os.boot, func(bf bootFile) bool { return bf.digest == f.Digest })
		dst := filepath.Join(b.tree, filepath.FromSlash(bundlefmt.OSFile(f.Digest)))
		if _, err := os.Stat(dst); err == nil {
			continue // an initramfs that is also another: one file
		}
		if err := stage.CopyFile(b.os.boot[i].local, dst, 0o644); err != nil {
			return fmt.Errorf("boot file %s: %w", f.Name, err)
		}
	}
	if o.Usr.Pack == nil {
		return nil
	}
	task := b.o.Progress.Task("write the OS slot's pack", o.Usr.Pack.Size)
	err := b.writePack(dir, task)
	task.Done(err)
	return err
}

// writePack writes the chunks the prior releases lack into dir, named by their
// digest, and records it in the manifest.
func (b *bundler) writePack(dir string, progress io.Writer) error {
	f, err := os.CreateTemp(dir, ".pack-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := slotcut.WritePack(io.MultiWriter(f, h, progress), b.os.image, b.os.index, b.packPriors...)
	if err != nil {
		return fmt.Errorf("OS slot pack: %w", err)
	}
	if n != b.m.OS.Usr.Pack.Size {
		return fmt.Errorf("kiln bug: the OS slot pack is %d bytes, %d planned", n, b.m.OS.Usr.Pack.Size)
	}
	d := digest.NewDigest(digest.SHA256, h).String()
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), filepath.Join(b.tree, filepath.FromSlash(bundlefmt.OSFile(d)))); err != nil {
		return err
	}
	b.m.OS.Usr.Pack.Digest = d
	return nil
}

func indexDigest(x *slot.Index) (string, error) {
	d, err := x.Digest()
	if err != nil {
		return "", err
	}
	return digest.NewDigestFromBytes(digest.SHA256, d[:]).String(), nil
}
