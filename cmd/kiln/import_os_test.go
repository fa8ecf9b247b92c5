//go:build !nodeonly

package main

// Black-box tests of `kiln agent import` of a bundle with an OS section
// (issue 23), on a node tree of its own made from a factory disk built on
// an A/B base without a loop device: the image partition's kiln.json and
// oci/ taken out with unsquashfs, the four slot partitions as files under
// /dev/disk/by-partuuid, the ESP's files (mtools) under /efi, the kernel
// command line the factory's entry gives, and LoaderEntrySelected.

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unicode/utf16"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/agent/osinstall"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// osNode is a node's tree whose OS is in A/B slots.
type osNode struct {
	importNode
	slots contract.OSSlots
}

// newOSNode makes the tree of a node freshly flashed with disk, booted from
// its release's entry.
func newOSNode(t *testing.T, rs *releases, disk string) *osNode {
	t.Helper()
	n := &osNode{importNode: importNode{root: t.TempDir()}}
	l, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	part := func(name string) string {
		p, ok := l.Find(name)
		if !ok {
			t.Fatalf("%s has no partition %s", disk, name)
		}
		out := filepath.Join(tmp, name)
		copyRange(t, disk, p.Offset, p.Size, out)
		return out
	}
	img := filepath.Join(n.root, contract.MountPoint)
	os.MkdirAll(filepath.Dir(img), 0o755)
	run(t, "unsquashfs", "-q", "-n", "-d", img, part(contract.PartitionName), contract.ContentsFile, contract.OCIDir)
	c, err := contract.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	n.slots = *c.OSSlots
	for _, s := range n.slots.Slots {
		for _, sp := range []contract.SlotPartition{s.Usr, s.UsrVerity} {
			p, _ := l.Find(sp.Name)
			copyRange(t, disk, p.Offset, p.Size, n.dev(sp))
		}
	}
	esp := filepath.Join(n.root, bootloader.ESP)
	os.MkdirAll(esp, 0o755)
	dirs, entry := []string{"::/loader", "::/kiln"}, n.slots.Entry+bootentry.Suffix
	if c.SecureBoot != nil { // signed images in EFI/Linux, no kernel files
		dirs, entry = []string{"::/loader", "::/EFI"}, n.slots.Entry+bootentry.UKISuffix
	}
	cmd := exec.Command("mcopy", append(append([]string{"-s", "-n", "-i", part("EFI-SYSTEM")}, dirs...), esp)...)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	n.bootEntry(t, entry)
	n.setupTrust(t, rs.pub)
	return n
}

func copyRange(t *testing.T, from string, off, size int64, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	os.MkdirAll(filepath.Dir(to), 0o755)
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := io.Copy(dst, io.NewSectionReader(src, off, size)); err != nil {
		t.Fatal(err)
	}
}

func (n *osNode) dev(p contract.SlotPartition) string {
	return filepath.Join(n.root, osinstall.ByPartUUID, p.PartUUID)
}

func (n *osNode) esp() string { return filepath.Join(n.root, bootloader.ESP) }

// bootEntry makes the node look booted from the entry file name: the
// boot loader's LoaderEntrySelected, and the kernel command line the entry
// gives.
func (n *osNode) bootEntry(t *testing.T, name string) {
	t.Helper()
	parsed, err := bootentry.ParseFileName(name)
	if err != nil {
		t.Fatal(err)
	}
	e, err := bootloader.Read(n.esp(), parsed)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(n.root, osinstall.Cmdline)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("BOOT_IMAGE="+e.Linux+" "+strings.Join(e.Options, " ")+"\n"), 0o644)
	b := []byte{7, 0, 0, 0}
	for _, c := range utf16.Encode([]rune(name + "\x00")) {
		b = append(b, byte(c), byte(c>>8))
	}
	dir := filepath.Join(n.root, bootloader.Efivars)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"), b, 0o644)
}

func (n *osNode) entries(t *testing.T) string {
	t.Helper()
	names, err := bootloader.Entries(n.esp())
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, x := range names {
		s = append(s, x.String())
	}
	return strings.Join(s, " ")
}

func (n *osNode) copyOS(t *testing.T) *osNode {
	t.Helper()
	c := &osNode{importNode: importNode{root: t.TempDir()}, slots: n.slots}
	if out, err := exec.Command("cp", "-a", n.root+"/.", c.root).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	return c
}

// checkBootable checks what must hold at every instant: every entry on the
// ESP that mounts a slot boots one whose bytes give the entry's root hash
// (veritysetup verify), and its kernel and initramfs are whole.
func (n *osNode) checkBootable(t *testing.T) {
	t.Helper()
	names, err := bootloader.Entries(n.esp())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		e, err := bootloader.Read(n.esp(), name)
		if err != nil {
			t.Fatal(err)
		}
		u, ok, err := bootentry.ParseUsrVerity(e.Options)
		if !ok || err != nil {
			t.Errorf("entry %s mounts no slot (%v)", name, err)
			continue
		}
		data := filepath.Join(n.root, osinstall.ByPartUUID, u.DataPartUUID)
		hash := filepath.Join(n.root, osinstall.ByPartUUID, u.HashPartUUID)
		if out, err := exec.Command("veritysetup", "verify", data, hash, u.RootHash).CombinedOutput(); err != nil {
			t.Errorf("entry %s boots a slot that does not verify against its root hash: %v\n%s", name, err, out)
		}
		for _, p := range append([]string{e.Linux}, e.Initrd...) {
			if _, err := os.Stat(filepath.Join(n.esp(), p)); err != nil {
				t.Errorf("entry %s boots %s: %v", name, p, err)
			}
		}
	}
}

// slotImage is the usr slot image of an A/B base (its usr-a's first size bytes).
func slotImage(t *testing.T, base string, size int64) []byte {
	t.Helper()
	b := make([]byte, size)
	if _, err := usrA(t, base).ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestImportOS(t *testing.T) {
	rs := newReleases(t)
	rs.slotBases(t)
	r10 := rs.recipeOn(t, "ab-1.0.raw", "acme", "1.0.0", releaseFiles)
	r11 := rs.recipeOn(t, "ab-1.1.raw", "acme", "1.1.0", releaseFiles)
	r11same := rs.recipeOn(t, "ab-1.0.raw", "acme-same", "1.1.0", releaseFiles)
	os.Rename(filepath.Dir(r11same), filepath.Join(rs.dir, "acme-1.1.0-same"))
	r11same = filepath.Join(rs.dir, "acme-1.1.0-same", "appliance.yaml")
	y, _ := os.ReadFile(r11same)
	os.WriteFile(r11same, []byte(strings.Replace(string(y), "name: acme-same\n", "name: acme\n", 1)), 0o644)
	disk10 := filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10)
	rs.mustKiln(t, "lock", r11)
	rs.mustKiln(t, "lock", r11same)
	b11 := filepath.Join(rs.dir, "upgrade-1.1.kiln")
	rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key, "--from", disk10, "--format", "file")
	m := readManifest(t, rs, b11)
	u := m.OS.Usr
	base := newOSNode(t, rs, disk10)
	slotA, slotB := base.slots.Slots[0], base.slots.Slots[1]
	if got := base.entries(t); got != "kiln-1.0.conf" {
		t.Fatalf("the factory disk's entries: %q", got)
	}

	staged := base.copyOS(t)
	t.Run("writes the inactive slot and proves it before the entry", func(t *testing.T) {
		n := staged
		out := n.mustKiln(t, rs, "agent", "import", b11)
		t.Logf("the console:\n%s", out)
		for _, want := range []string{
			"os: writing ", `into "usr-b" (slot b)`,
			"os: slot b proven: dm-verity root hash " + u.Verity.RootHash,
			"os: initrd.img ", "boot loader: entry kiln-1.1.0+3.conf of release 1.1.0 written, 3 tries",
			"release 1.1.0 is staged",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the console lacks %q:\n%s", want, out)
			}
		}
		if i, j := strings.Index(out, "proven"), strings.Index(out, "entry kiln-1.1.0+3.conf"); i < 0 || j < i {
			t.Errorf("the entry was not written after the slot was proven:\n%s", out)
		}
		s := n.state(t)
		if s.Staged == nil || s.Staged.OS == nil || s.Staged.OS.Slot != "b" || s.Staged.OS.Entry != "kiln-1.1.0" || s.Staged.OS.RootHash != u.Verity.RootHash {
			t.Fatalf("staged %+v", s.Staged)
		}
		if s.Current.OS == nil || s.Current.OS.Slot != "a" || s.Current.OS.Entry != "kiln-1.0" {
			t.Errorf("current's OS %+v: want the factory's, slot a", s.Current.OS)
		}
		got, _ := os.ReadFile(n.dev(slotB.Usr))
		if string(got[:u.Size]) != string(slotImage(t, filepath.Join(rs.dir, "ab-1.1.raw"), u.Size)) {
			t.Error("usr-b does not hold 1.1's slot image")
		}
		if got := n.entries(t); got != "kiln-1.0.conf kiln-1.1.0+3.conf" {
			t.Errorf("entries %q", got)
		}
		e, err := bootloader.Read(n.esp(), bootentry.Name{ID: "kiln-1.1.0", Counting: true, Left: 3})
		if err != nil {
			t.Fatal(err)
		}
		uv, _, _ := bootentry.ParseUsrVerity(e.Options)
		if uv.DataPartUUID != slotB.Usr.PartUUID || uv.HashPartUUID != slotB.UsrVerity.PartUUID || uv.RootHash != u.Verity.RootHash || e.Version != "1.1" {
			t.Errorf("the entry boots %+v, version %q: want usr-b with 1.1's root hash", uv, e.Version)
		}
		for _, f := range append([]bundlefmt.BootFile{m.OS.Entry.Kernel}, m.OS.Entry.Initrd...) {
			if d, err := bootloader.Digest(n.esp(), bootloader.BootFilePath(f.Digest)); err != nil || d != f.Digest {
				t.Errorf("%s on the ESP: %s (%v), want %s", f.Name, d, err, f.Digest)
			}
		}
		n.checkBootable(t)

		before := n.snapshot(t)
		if out := n.mustKiln(t, rs, "agent", "import", b11); !strings.Contains(out, "already staged") {
			t.Errorf("the same stick again:\n%s", out)
		}
		if d := diffSnapshot(before, n.snapshot(t)); d != "" {
			t.Errorf("the same stick again changed the node:\n%s", d)
		}
	})

	t.Run("the upgrade boot tries and confirms 1.1 from its entry", func(t *testing.T) {
		n := staged.copyOS(t)
		n.bootEntry(t, "kiln-1.1.0+3.conf")
		n.mustRelease(t, rs, "begin")
		if s := n.state(t); s.Trying == nil || s.Trying.Version != "1.1.0" {
			t.Fatalf("begin: %+v", s)
		}
		n.mustRelease(t, rs, "confirm", "1.1.0")
		if s := n.state(t); s.Current.Version != "1.1.0" || s.Current.OS.Slot != "b" {
			t.Errorf("confirm: %+v", s.Current)
		}
		if out := rs.mustKiln(t, "agent", "status", "--root", n.root); !strings.Contains(out, "booted:   kiln-1.1.0 (release 1.1.0, slot b)") {
			t.Errorf("status:\n%s", out)
		}
	})

	t.Run("a release with an agent of its own is stored and named on its entry", func(t *testing.T) {
		// Another agent than the factory disk's: a copy of it with a byte
		// appended (an ELF runs with trailing bytes).
		other := filepath.Join(t.TempDir(), "kiln-agent")
		copyFile(t, filepath.Join(filepath.Dir(kilnBin), "kiln-agent"), other)
		f, _ := os.OpenFile(other, os.O_APPEND|os.O_WRONLY, 0o755)
		f.Write([]byte{0})
		f.Close()
		os.Chmod(other, 0o755)
		b := filepath.Join(t.TempDir(), "upgrade-1.1-agent.kiln")
		rs.mustKiln(t, "bundle", r11, "-o", b, "--key", rs.key, "--from", disk10, "--format", "file", "--agent", other)
		ma := readManifest(t, rs, b)
		if !ma.AgentOnStick {
			t.Fatalf("the bundle does not carry its agent: %+v", ma.Agent)
		}
		n := base.copyOS(t)
		n.mustKiln(t, rs, "agent", "import", b)
		s := n.state(t)
		if !slices.Contains(s.Staged.Blobs, ma.Agent.Digest) {
			t.Errorf("the release's blobs %v lack its agent %s", s.Staged.Blobs, ma.Agent.Digest)
		}
		n.checkStore(t)
		if !slices.Contains(s.Staged.OS.Options, "kiln.agent="+ma.Agent.Digest) {
			t.Errorf("the entry's options %v do not name the release's agent", s.Staged.OS.Options)
		}
		if e, err := bootloader.Read(n.esp(), bootentry.Name{ID: "kiln-1.1.0", Counting: true, Left: 3}); err != nil || !slices.Contains(e.Options, "kiln.agent="+ma.Agent.Digest) {
			t.Errorf("the entry on the ESP: %+v (%v)", e, err)
		}
		// 1.0's entry names no agent: the image partition's runs.
		if e, _ := bootloader.Read(n.esp(), bootentry.Name{ID: "kiln-1.0"}); strings.Contains(strings.Join(e.Options, " "), "kiln.agent=") {
			t.Errorf("1.0's entry: %v", e.Options)
		}
	})

	t.Run("the booted OS again: nothing written for it", func(t *testing.T) {
		same := filepath.Join(rs.dir, "upgrade-1.1-same.kiln")
		rs.mustKiln(t, "bundle", r11same, "-o", same, "--key", rs.key, "--from", disk10, "--format", "file")
		n := base.copyOS(t)
		usrB, _ := os.ReadFile(n.dev(slotB.Usr))
		out := n.mustKiln(t, rs, "agent", "import", same)
		if strings.Contains(out, "os: ") {
			t.Errorf("the OS was written:\n%s", out)
		}
		if s := n.state(t); s.Staged == nil || s.Staged.OS == nil || s.Staged.OS.Slot != slotA.Name || s.Staged.OS.Entry != "kiln-1.0" {
			t.Errorf("staged %+v: want the running OS's record", s.Staged)
		}
		if got, _ := os.ReadFile(n.dev(slotB.Usr)); string(got) != string(usrB) {
			t.Error("usr-b changed")
		}
		if got := n.entries(t); got != "kiln-1.0.conf" {
			t.Errorf("entries %q", got)
		}
	})

	refusals := []struct {
		name string
		edit func(t *testing.T, n *osNode)
		want []string
	}{
		{"a node without slots", func(t *testing.T, n *osNode) {
			n.editContents(t, func(c *contract.Contents) { c.OSSlots = nil })
		}, []string{"this node has no OS slots (its factory disk was built on a base without usr slots), and bundle 1.1.0 brings an OS: reflash"}},
		{"an OS for another arch", func(t *testing.T, n *osNode) {
			n.editContents(t, func(c *contract.Contents) { c.OSSlots.Arch = "arm64" })
		}, []string{"the bundle's OS is for amd64; this node's usr slots are arm64 partitions"}},
		{"a slot that does not fit", func(t *testing.T, n *osNode) {
			os.Truncate(n.dev(slotB.Usr), u.Size-4096)
		}, []string{`the release's usr slot image is `, `this node's "usr-b" (slot b) holds `, fmt.Sprintf("it must be at least %d bytes", u.Size)}},
		{"a hash tree that does not fit", func(t *testing.T, n *osNode) {
			os.Truncate(n.dev(slotB.UsrVerity), 4096)
		}, []string{"the release's dm-verity hash tree is ", `this node's "usr-b-verity" (slot b) holds 4.0 KiB`}},
		{"a boot not from a slot", func(t *testing.T, n *osNode) {
			os.WriteFile(filepath.Join(n.root, osinstall.Cmdline), []byte("root=LABEL=root rw\n"), 0o644)
		}, []string{"the kernel command line names no usr slot"}},
	}
	for _, tc := range refusals {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			n := base.copyOS(t)
			tc.edit(t, n)
			before := n.snapshot(t)
			out, code := n.kiln(t, rs, "agent", "import", b11)
			if code == 0 || !strings.Contains(out, "refused: ") || !strings.Contains(out, "nothing was changed") {
				t.Errorf("exit %d:\n%s", code, out)
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if d := diffSnapshot(before, n.snapshot(t)); d != "" {
				t.Errorf("a refused import changed the node:\n%s", d)
			}
		})
	}

	t.Run("a tampered chunk is refused before the entry is written", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "tampered.kiln")
		copyFile(t, b11, bad)
		off, size := packRange(t, rs, bad)
		f, _ := os.OpenFile(bad, os.O_RDWR, 0)
		b := []byte{0}
		f.ReadAt(b, off+size/2)
		b[0] ^= 0xff
		f.WriteAt(b, off+size/2)
		f.Close()
		n := base.copyOS(t)
		out, code := n.kiln(t, rs, "agent", "import", bad)
		if code == 0 || !strings.Contains(out, "refused: import 1.1.0: slot write: damaged: ") || !strings.Contains(out, "of the stick's pack are not chunk") ||
			!strings.Contains(out, "the inactive slot has no boot entry and the node stays on release 1.0.0") {
			t.Errorf("exit %d:\n%s", code, out)
		}
		if s := n.state(t); s.Staged != nil {
			t.Errorf("staged %+v", s.Staged)
		}
		if got := n.entries(t); got != "kiln-1.0.conf" {
			t.Errorf("entries %q", got)
		}
		n.checkBootable(t)
		// The good stick then imports: the chunks already in place are kept.
		out = n.mustKiln(t, rs, "agent", "import", b11)
		if !strings.Contains(out, "keeping what an earlier import wrote") {
			t.Errorf("the second import did not resume:\n%s", out)
		}
		n.checkBootable(t)
		if got := n.entries(t); got != "kiln-1.0.conf kiln-1.1.0+3.conf" {
			t.Errorf("entries %q", got)
		}
	})

	t.Run("killed at every step and run again", func(t *testing.T) {
		killEverywhere(t, rs, base, staged, b11, "kiln-1.0.conf", "kiln-1.0.conf kiln-1.1.0+3.conf")
	})
}

// killEverywhere imports b on copies of base, killed at each step the
// import reaches: at every instant each entry boots a whole slot, the
// entries are before (nothing staged) or before or after (staged), and the
// import run again leaves the node as an uninterrupted one did (staged).
func killEverywhere(t *testing.T, rs *releases, base, staged *osNode, b, before, after string) {
	t.Helper()
	want := staged.snapshotOS(t)
	var steps []string
	n := base.copyOS(t)
	n.runImportChild(t, b, "", &steps)
	if d := diffSnapshot(want, n.snapshotOS(t)); d != "" {
		t.Fatalf("the helper's import differs from kiln's:\n%s", d)
	}
	if len(steps) < 8 {
		t.Fatalf("steps %q", steps)
	}
	t.Logf("%d steps: %q", len(steps), steps)
	for _, step := range steps {
		killed := base.copyOS(t)
		if !killed.runImportChild(t, b, step, nil) {
			t.Errorf("the import did not reach %q", step)
			continue
		}
		killed.checkBootable(t)
		if s := killed.stateOrNil(t); s != nil && s.Staged != nil {
			if got := killed.entries(t); got != before && got != after {
				t.Errorf("killed at %q: entries %q", step, got)
			}
		} else if got := killed.entries(t); got != before {
			t.Errorf("killed at %q, nothing staged: entries %q", step, got)
		}
		killed.mustKiln(t, rs, "agent", "import", b)
		if d := diffSnapshot(want, killed.snapshotOS(t)); d != "" {
			t.Errorf("killed at %q, then run again: the node differs from an uninterrupted import:\n%s", step, d)
		}
	}
}

// snapshotOS is snapshot without what differs between two runs of the same
// import by design: the resume hint, containers/storage's lock, and the time the state's last result
// was stamped with.
func (n *osNode) snapshotOS(t *testing.T) map[string]string {
	s := n.snapshot(t)
	delete(s, strings.TrimPrefix(osinstall.Writing, "/"))
	delete(s, "var/lib/containers/storage/storage.lock") // a random lock ID
	if st := n.stateOrNil(t); st != nil {
		if st.Last != nil {
			st.Last.Time = 0
		}
		b, _ := state.Encode(st)
		s[strings.TrimPrefix(contract.StateFile, "/")] = string(b)
	}
	return s
}

func (n *osNode) stateOrNil(t *testing.T) *state.State {
	if _, err := os.Stat(filepath.Join(n.root, contract.StateFile)); err != nil {
		return nil
	}
	return n.state(t)
}

// readManifest opens a bundle file as the node does.
func readManifest(t *testing.T, rs *releases, p string) *bundlefmt.Manifest {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pemKey, _ := os.ReadFile(rs.pub)
	pub, err := bundlefmt.ParsePublicKey(pemKey)
	if err != nil {
		t.Fatal(err)
	}
	m, _, _, err := bundlefmt.Open(f, []ed25519.PublicKey{pub})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// packRange is where the OS section's pack is in a bundle file.
func packRange(t *testing.T, rs *releases, p string) (off, size int64) {
	t.Helper()
	f, _ := os.Open(p)
	defer f.Close()
	pemKey, _ := os.ReadFile(rs.pub)
	pub, _ := bundlefmt.ParsePublicKey(pemKey)
	m, h, _, err := bundlefmt.Open(f, []ed25519.PublicKey{pub})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(m.Files, func(x bundlefmt.File) bool { return x.Path == bundlefmt.OSFile(m.OS.Usr.Pack.Digest) })
	return h.Size + m.Files[i].Offset, m.Files[i].Size
}

// runImportChild imports b on n in a child dying at dieAt; it reports
// whether the child was killed, and collects the steps it reached.
func (n *osNode) runImportChild(t *testing.T, b, dieAt string, steps *[]string) bool {
	t.Helper()
	job, _ := json.Marshal(importHelperJob{Root: n.root, Bundle: b, DieAt: dieAt})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), importHelperEnv+"="+string(job))
	out, err := cmd.CombinedOutput()
	if steps != nil {
		for _, l := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(l, "STEP "); ok {
				*steps = append(*steps, s)
			}
		}
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	if err != nil {
		t.Fatalf("import (die at %q): %v\n%s", dieAt, err, out)
	}
	return false
}
