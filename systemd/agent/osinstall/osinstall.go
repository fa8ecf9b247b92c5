// Package osinstall writes a release's OS, from a bundle's OS section, into
// the node's inactive A/B slot (issue 23): the usr slot from the stick's pack
// and the active slot (slotwrite, every chunk checked against the signed
// index before it is written), its dm-verity hash partition formatted with
// the signed values and proven to give the signed root hash (slotwrite.Seal),
// the kernel and initramfs copied onto the ESP by digest. It never writes a
// boot loader entry: the release state machine does, last, once the release
// is recorded as staged (systemd/agent/release), so a slot written here is
// never bootable before it is whole and proven.
//
// The node's slots are kiln.json's (contract.OSSlots: partitions by
// PARTUUID); which one is active is what the running kernel mounted /usr
// from (/proc/cmdline: systemd.verity_usr_data= and usrhash=), never a guess.
// Before a byte of the inactive slot is written, every entry on the ESP that
// boots it is removed: a half-written slot has no entry.
package osinstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/freespace"
	"github.com/kiln-appliance/kiln/systemd/agent/slotwrite"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

// Node paths.
const (
	// ByPartUUID is where udev names partitions by PARTUUID.
	ByPartUUID = "/dev/disk/by-partuuid"
	// Cmdline is the running kernel's command line.
	Cmdline = "/proc/cmdline"
	// Writing records which slot is being written with which index: a
	// second import of the same release keeps the chunks already in place
	// (slotwrite.WithResume) instead of writing them again. Only a hint:
	// every chunk kept is checked.
	Writing = "/var/lib/kiln/slot-writing.json"
)

// ErrNoSlots: the node's OS is not in A/B slots, so a bundle's OS cannot be
// installed on it.
var ErrNoSlots = errors.New("this node has no OS slots")

// Node is what the node knows of its OS.
type Node struct {
	Root  string            // prefixes every node path (tests run on a tree)
	ESP   string            // where the ESP is mounted (bootloader.ESP)
	Slots *contract.OSSlots // kiln.json's; nil on a node without slots
	// Base is the release the node runs, as a delta names its bases.
	Base contract.ReleaseID
	// Entry is the ID of that release's boot loader entry ("" unknown).
	Entry string
	// PartitionAgent is the digest of the image partition's kiln agent:
	// a release whose agent is another one names its own on its entry
	// (contract.AgentParam).
	PartitionAgent string
	// SecureBoot is kiln.json's record of a Secure Boot-ready node (its db
	// certificate); nil on a node without: entries are then type #1.
	SecureBoot *contract.SecureBoot
}

func (n Node) path(p string) string { return filepath.Join(n.Root, p) }

func (n Node) esp() string { return n.path(n.ESP) }

func (n Node) device(s contract.SlotPartition) string {
	return n.path(filepath.Join(ByPartUUID, s.PartUUID))
}

// Booted is the slot the running kernel mounted /usr from, and its root
// hash, read from the kernel command line the boot loader entry gave it.
func (n Node) Booted() (contract.OSSlot, string, error) {
	if n.Slots == nil {
		return contract.OSSlot{}, "", ErrNoSlots
	}
	b, err := os.ReadFile(n.path(Cmdline))
	if err != nil {
		return contract.OSSlot{}, "", fmt.Errorf("the booted slot: %w", err)
	}
	u, ok, err := bootentry.ParseUsrVerity(strings.Fields(string(b)))
	switch {
	case err != nil:
		return contract.OSSlot{}, "", fmt.Errorf("the booted slot: kernel command line: %w", err)
	case !ok:
		return contract.OSSlot{}, "", fmt.Errorf("the booted slot: the kernel command line names no usr slot (usrhash=, systemd.verity_usr_data=): this boot did not mount /usr from a slot, so the node cannot tell which slot is free")
	}
	for _, s := range n.Slots.Slots {
		if s.Usr.PartUUID == u.DataPartUUID {
			if s.UsrVerity.PartUUID != u.HashPartUUID {
				return contract.OSSlot{}, "", fmt.Errorf("the booted slot: /usr is %s (slot %s) but its hash tree is PARTUUID %s, not %s: the kernel command line does not match kiln.json's slots", s.Usr.Name, s.Name, u.HashPartUUID, s.UsrVerity.PartUUID)
			}
			return s, u.RootHash, nil
		}
	}
	return contract.OSSlot{}, "", fmt.Errorf("the booted slot: /usr is PARTUUID %s, which is neither of kiln.json's slots (%s, %s)", u.DataPartUUID, n.Slots.Slots[0].Usr.PartUUID, n.Slots.Slots[1].Usr.PartUUID)
}

// Plan is what installing a bundle's OS does on this node, decided before
// anything is written: Prepare refuses what cannot be done.
type Plan struct {
	// OS is the release's OS record: the slot, root hash and the entry
	// the state machine writes once the release is staged.
	OS contract.ReleaseOS
	// WritesSlot says the inactive slot is written; false when the bundle's
	// /usr is the active one's (same root hash).
	WritesSlot bool
	// Unchanged: the bundle's OS is the one the node runs, /usr, kernel,
	// initramfs and command line alike. Nothing is written; the release
	// keeps the running release's OS record and entry.
	Unchanged bool

	node           Node
	m              *bundlefmt.Manifest
	r              io.ReaderAt // the bundle; its filesystem at fsStart
	fsStart        int64
	target, active contract.OSSlot
	index          *slot.Index
	bases          []*slot.Index
	base           *slot.Index
	boot           []bootFile
	uki            *ukiPlan // a Secure Boot node's entry, checked
}

// bootFile is a kernel or initramfs the entry boots, and where it comes from.
type bootFile struct {
	bundlefmt.BootFile
	from string // the node's own copy on the ESP; "" when on the stick
	// there: already in place on the ESP
	there bool
}

// Prepare checks that the node can take the OS of bundle m (its filesystem
// at fsStart in r) and decides how: the target slot, the entry, where each
// boot file comes from. It writes nothing.
func Prepare(n Node, m *bundlefmt.Manifest, r io.ReaderAt, fsStart int64) (*Plan, error) {
	o := m.OS
	if o == nil {
		return nil, errors.New("the bundle has no OS section")
	}
	if n.Slots == nil {
		return nil, fmt.Errorf("%w (its factory disk was built on a base without usr slots), and bundle %s brings an OS: reflash the node with a disk built on an A/B base, or bring this release in a bundle made for nodes without slots", ErrNoSlots, m.Version)
	}
	if m.Arch != n.Slots.Arch {
		return nil, fmt.Errorf("the bundle's OS is for %s; this node's usr slots are %s partitions: use a bundle made for %s", m.Arch, n.Slots.Arch, n.Slots.Arch)
	}
	active, activeHash, err := n.Booted()
	if err != nil {
		return nil, err
	}
	p := &Plan{node: n, m: m, r: r, fsStart: fsStart, active: active}
	if p.index, p.bases, err = m.CheckOS(r, fsStart); err != nil {
		return nil, err
	}
	for i, b := range o.Usr.Bases {
		if b.ReleaseID == n.Base || b.Version == n.Base.Version && n.Base.LockDigest == "" {
			p.base = p.bases[i]
		}
	}
	p.target = active
	p.WritesSlot = o.Usr.Verity.RootHash != activeHash
	if p.WritesSlot {
		p.target = other(n.Slots, active)
		if err := p.checkFits(); err != nil {
			return nil, err
		}
	}
	entry, err := p.entry()
	if err != nil {
		return nil, err
	}
	if n.SecureBoot != nil {
		return p.prepareSecureBoot(entry)
	}
	if !p.WritesSlot {
		if p.Unchanged, err = p.sameAsRunning(entry); err != nil || p.Unchanged {
			return p, err
		}
	}
	if err := p.findBootFiles(); err != nil {
		return nil, err
	}
	p.OS = contract.ReleaseOS{Slot: p.target.Name, RootHash: o.Usr.Verity.RootHash, Entry: entry.ID,
		Title: entry.Title, Version: entry.Version, Linux: entry.Linux, Initrd: entry.Initrd, Options: entry.Options}
	if err := p.OS.Check(); err != nil {
		return nil, fmt.Errorf("the bundle's boot entry: %w", err)
	}
	return p, nil
}

// prepareSecureBoot is the rest of Prepare on a Secure Boot node: the
// signed image instead of the kernel and initramfs files.
func (p *Plan) prepareSecureBoot(entry bootentry.Entry) (*Plan, error) {
	if err := p.checkUKI(entry); err != nil {
		return nil, err
	}
	fail := func(err error) (*Plan, error) {
		p.Close()
		return nil, err
	}
	if !p.WritesSlot {
		same, err := p.sameUKIAsRunning()
		if err != nil {
			return fail(err)
		}
		if p.Unchanged = same; same {
			p.Close()
			return p, nil
		}
	}
	if err := p.ukiFits(); err != nil {
		return fail(err)
	}
	if err := p.OS.Check(); err != nil {
		return fail(fmt.Errorf("the bundle's boot entry: %w", err))
	}
	return p, nil
}

func other(s *contract.OSSlots, sl contract.OSSlot) contract.OSSlot {
	if sl.Name == s.Slots[0].Name {
		return s.Slots[1]
	}
	return s.Slots[0]
}

// checkFits refuses a slot image or hash tree larger than the inactive
// slot's partitions, as the kernel sees them.
func (p *Plan) checkFits() error {
	u := p.m.OS.Usr
	for _, c := range []struct {
		part contract.SlotPartition
		need int64
		what string
	}{
		{p.target.Usr, u.Size, "usr slot image"},
		{p.target.UsrVerity, u.Verity.HashSize(), "dm-verity hash tree"},
	} {
		size, err := deviceSize(p.node.device(c.part))
		if err != nil {
			return err
		}
		if c.need > size {
			return fmt.Errorf("the release's %s is %s (%d bytes); this node's %q (slot %s) holds %s: it must be at least %d bytes (rebuild the release with a smaller OS, or reflash the node with larger slots)",
				c.what, human.Bytes(c.need), c.need, c.part.Name, p.target.Name, human.Bytes(size), c.need)
		}
	}
	return nil
}

// deviceSize is a partition's (or, in tests, a file's) size in bytes.
func deviceSize(p string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, fmt.Errorf("the node's slot partition: %w", err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("the size of %s: %w", p, err)
	}
	return n, nil
}

// entry is the release's boot loader entry: the bundle's, with the target
// slot's partitions and the boot files at their ESP paths by digest.
func (p *Plan) entry() (bootentry.Entry, error) {
	e := p.m.OS.Entry
	usr, err := bootentry.UsrVerity{RootHash: p.m.OS.Usr.Verity.RootHash, DataPartUUID: p.target.Usr.PartUUID,
		HashPartUUID: p.target.UsrVerity.PartUUID, FSType: e.UsrFSType}.Options()
	if err != nil {
		return bootentry.Entry{}, fmt.Errorf("the bundle's boot entry: %w", err)
	}
	be := bootentry.Entry{ID: contract.EntryID(p.m.Version), Title: e.Title, Version: e.Version,
		Linux: bootloader.BootFilePath(e.Kernel.Digest), Options: append(slices.Clone(e.Options), usr...)}
	if a := p.m.Agent.Digest; a != p.node.PartitionAgent {
		be.Options = append(be.Options, contract.AgentOption(a))
	}
	for _, f := range e.Initrd {
		be.Initrd = append(be.Initrd, bootloader.BootFilePath(f.Digest))
	}
	return be, be.Check()
}

// sameAsRunning says whether entry boots what the running release's entry
// boots: the same kernel and initramfs (by digest) with the same command
// line (the slot's parameters included: the same slot and root hash).
func (p *Plan) sameAsRunning(entry bootentry.Entry) (bool, error) {
	esp := p.node.esp()
	n, ok, err := bootloader.Find(esp, p.node.Entry)
	if err != nil || !ok || p.node.Entry == "" {
		return false, err
	}
	cur, err := bootloader.Read(esp, n)
	if err != nil {
		return false, err
	}
	if !slices.Equal(cur.Options, entry.Options) || len(cur.Initrd) != len(p.m.OS.Entry.Initrd) {
		return false, nil
	}
	want := []string{p.m.OS.Entry.Kernel.Digest}
	for _, f := range p.m.OS.Entry.Initrd {
		want = append(want, f.Digest)
	}
	for i, path := range append([]string{cur.Linux}, cur.Initrd...) {
		d, err := bootloader.Digest(esp, path)
		if err != nil || d != want[i] {
			return false, nil //nolint:nilerr // a file the entry names but the ESP lacks is not the same OS
		}
	}
	return true, nil
}

// findBootFiles says where each boot file comes from: already in place,
// the stick, or the node's own copy (a delta leaves out a file every base
// boots); and refuses when the ESP has no room for those to copy.
func (p *Plan) findBootFiles() error {
	e := p.m.OS.Entry
	esp := p.node.esp()
	var removed []bootentry.Name // the target slot's entries, removed before the files are copied
	if p.WritesSlot {
		var err error
		if removed, err = p.targetEntries(); err != nil {
			return err
		}
	}
	var need int64
	for _, f := range append([]bundlefmt.BootFile{e.Kernel}, e.Initrd...) {
		bf := bootFile{BootFile: f}
		there, err := bootloader.HasBootFile(esp, f.Digest)
		if err != nil {
			return err
		}
		bf.there = there
		if !there && !f.OnStick {
			if bf.from, err = bootloader.FindFile(esp, f.Digest, f.Size, removed...); err != nil {
				return err
			}
			if bf.from == "" {
				return fmt.Errorf("the bundle leaves out %s (%s) as a file the node boots already, and no boot entry on this node's ESP boots it: use a full bundle, or one made from this node's release", f.Name, f.Digest)
			}
		}
		if !there {
			need += f.Size
		}
		p.boot = append(p.boot, bf)
	}
	free, err := freeOnESP(p)
	if err != nil {
		return err
	}
	if need > free {
		return fmt.Errorf("the release's kernel and initramfs need %s on the ESP (%s), which has %s free: it must have %d bytes more free", human.Bytes(need), p.node.ESP, human.Bytes(free), need-free)
	}
	return nil
}

// freeOnESP is the ESP's free space once the entries of the slot written
// are removed with what they take with them.
func freeOnESP(p *Plan) (int64, error) {
	free, err := freespace.Available(p.node.esp())
	if err != nil || !p.WritesSlot {
		return free, err
	}
	freed, err := p.freedOnESP()
	return free + freed, err
}

// Option changes how Write works.
type Option func(*options)

type options struct {
	log  io.Writer
	step func(string)
	jobs int
}

// WithLog sets where Write says what it does.
func WithLog(w io.Writer) Option { return func(o *options) { o.log = w } }

// WithStepHook calls f before each step (the crash tests kill there).
func WithStepHook(f func(string)) Option { return func(o *options) { o.step = f } }

// WithJobs is slotwrite.WithJobs.
func WithJobs(n int) Option { return func(o *options) { o.jobs = n } }

// Write puts the release's OS on the node: every entry booting the target
// slot removed, the slot written and sealed against the signed root hash,
// the boot files on the ESP. Each step keeps what an earlier, interrupted
// Write finished, so running it again resumes. It writes no entry.
func (p *Plan) Write(ctx context.Context, opts ...Option) error {
	o := options{log: io.Discard, step: func(string) {}}
	for _, opt := range opts {
		opt(&o)
	}
	if p.Unchanged {
		return nil
	}
	if p.WritesSlot {
		if err := p.writeSlot(ctx, o); err != nil {
			return err
		}
	}
	if p.uki != nil {
		return p.writeUKI(o)
	}
	for _, f := range p.boot {
		if f.there {
			continue
		}
		o.step("copy " + f.Name)
		if err := p.copyBootFile(f); err != nil {
			return err
		}
		fmt.Fprintf(o.log, "os: %s (%s) copied onto the ESP\n", f.Name, human.Bytes(f.Size))
	}
	return nil
}

// writeSlot removes the entries that boot the target slot, writes the slot and seals it.
func (p *Plan) writeSlot(ctx context.Context, o options) error {
	o.step("remove entries")
	if err := p.removeTargetEntries(o.log); err != nil {
		return err
	}
	u := p.m.OS.Usr
	data, hash := p.node.device(p.target.Usr), p.node.device(p.target.UsrVerity)
	mark := writing{Slot: p.target.Name, Index: u.Index}
	resume := p.readMark() == mark
	o.step("mark")
	if err := p.writeMark(mark); err != nil {
		return err
	}
	dst, err := os.OpenFile(data, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("the inactive slot: %w", err)
	}
	defer dst.Close()
	capacity, err := dst.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	src := slotwrite.Source{Index: p.index, PackBases: p.bases}
	if p.base != nil {
		act, err := os.Open(p.node.device(p.active.Usr))
		if err != nil {
			return fmt.Errorf("the active slot: %w", err)
		}
		defer act.Close()
		src.Base, src.Active = p.base, act
	}
	if u.Pack != nil {
		off, size, err := p.file(u.Pack.Digest)
		if err != nil {
			return err
		}
		src.Pack = io.NewSectionReader(p.r, off, size)
	}
	wopts := []slotwrite.Option{}
	if resume {
		wopts = append(wopts, slotwrite.WithResume())
	}
	if o.jobs > 0 {
		wopts = append(wopts, slotwrite.WithJobs(o.jobs))
	}
	half := false
	wopts = append(wopts, slotwrite.WithProgress(func(done, total int64) {
		if !half && done >= total/2 {
			half = true
			o.step("half the slot written")
		}
	}))
	kept := ""
	if resume {
		kept = ", keeping what an earlier import wrote"
	}
	fmt.Fprintf(o.log, "os: writing %s of /usr into %q (slot %s)%s\n", human.Bytes(u.Size), p.target.Usr.Name, p.target.Name, kept)
	o.step("write slot")
	st, err := slotwrite.Write(ctx, dst, capacity, src, wopts...)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.log, "os: slot %s written: %s from the active slot, %s from the stick, %s already in place\n",
		p.target.Name, human.Bytes(st.Seeded), human.Bytes(st.Packed), human.Bytes(st.Kept))
	o.step("seal")
	if err := slotwrite.Seal(ctx, data, hash, u.Verity); err != nil {
		return err
	}
	if err := syncFile(hash); err != nil {
		return err
	}
	fmt.Fprintf(o.log, "os: slot %s proven: dm-verity root hash %s, as signed\n", p.target.Name, u.Verity.RootHash)
	return nil
}

// targetEntries are the entries on the ESP that boot the target slot.
func (p *Plan) targetEntries() ([]bootentry.Name, error) {
	esp := p.node.esp()
	names, err := bootloader.Entries(esp)
	if err != nil {
		return nil, err
	}
	var out []bootentry.Name
	for _, n := range names {
		e, err := bootloader.Read(esp, n)
		if err != nil {
			return nil, err
		}
		if u, ok, _ := bootentry.ParseUsrVerity(e.Options); ok && (u.DataPartUUID == p.target.Usr.PartUUID || u.HashPartUUID == p.target.UsrVerity.PartUUID) {
			out = append(out, n)
		}
	}
	return out, nil
}

// freedOnESP is the bytes removeTargetEntries frees on the ESP: the boot files only the
// target slot's entries boot.
func (p *Plan) freedOnESP() (int64, error) {
	esp := p.node.esp()
	removed, err := p.targetEntries()
	if err != nil {
		return 0, err
	}
	names, err := bootloader.Entries(esp)
	if err != nil {
		return 0, err
	}
	files := map[string]bool{} // booted by a removed entry, and by no other
	for _, pass := range []bool{true, false} {
		for _, n := range names {
			if slices.Contains(removed, n) != pass {
				continue
			}
			e, err := bootloader.Read(esp, n)
			if err != nil {
				return 0, err
			}
			for _, f := range append([]string{e.Linux}, e.Initrd...) {
				if pass {
					files[f] = true
				} else {
					delete(files, f)
				}
			}
		}
	}
	var n int64
	for f := range files {
		if fi, err := os.Stat(filepath.Join(esp, filepath.Clean("/"+f))); err == nil {
			n += fi.Size()
		}
	}
	return n, nil
}

// removeTargetEntries removes every entry on the ESP that boots the target slot: from
// here on the slot's bytes change, and no entry may boot them until the
// state machine writes the new release's.
func (p *Plan) removeTargetEntries(log io.Writer) error {
	entries, err := p.targetEntries()
	if err != nil {
		return err
	}
	for _, n := range entries {
		files, err := bootloader.RemoveWithFiles(p.node.esp(), n.ID)
		if err != nil {
			return err
		}
		fmt.Fprintf(log, "os: boot entry %s removed (and %d boot file(s) no other entry boots): it booted slot %s, which is written now\n", n, len(files), p.target.Name)
	}
	return nil
}

// writing is the Writing marker's content.
type writing struct {
	Slot  string `json:"slot"`
	Index string `json:"index"`
}

func (p *Plan) readMark() writing {
	var w writing
	if b, err := os.ReadFile(p.node.path(Writing)); err == nil {
		json.Unmarshal(b, &w) //nolint:errcheck // a damaged hint is no hint
	}
	return w
}

func (p *Plan) writeMark(w writing) error {
	b, _ := json.Marshal(w)
	return atomicfile.WriteFile(p.node.path(Writing), append(b, '\n'), 0o644)
}

// file is where the OS section's file with digest d is in the bundle.
func (p *Plan) file(d string) (offset, size int64, err error) {
	i := slices.IndexFunc(p.m.Files, func(f bundlefmt.File) bool { return f.Path == bundlefmt.OSFile(d) })
	if i < 0 {
		return 0, 0, fmt.Errorf("%w: %s is not a file of the bundle", bundlefmt.ErrDamaged, bundlefmt.OSFile(d))
	}
	f := p.m.Files[i]
	return p.fsStart + f.Offset, f.Size, nil
}

func (p *Plan) copyBootFile(f bootFile) error {
	var r io.Reader
	if f.from != "" {
		src, err := os.Open(f.from)
		if err != nil {
			return err
		}
		defer src.Close()
		r = src
	} else {
		off, size, err := p.file(f.Digest)
		if err != nil {
			return err
		}
		r = io.NewSectionReader(p.r, off, size)
	}
	if err := bootloader.WriteBootFile(p.node.esp(), f.Digest, f.Size, r); err != nil {
		return fmt.Errorf("os: %s: %w", f.Name, err)
	}
	return nil
}

func syncFile(p string) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", p, err)
	}
	return nil
}
