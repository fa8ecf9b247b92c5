//go:build !nodeonly

package main

// Black-box tests of a field upgrade under Secure Boot: a factory disk
// built with secureBoot on the A/B base (signed unified kernel images in
// EFI/Linux), bundles of 1.1 made with --secure-boot-key --from it, and
// `kiln agent import` on the node's tree: the release's entry is the
// bundle's signed image for the slot written, renamed into EFI/Linux with
// tries left; every bundle the node must not take leaves it byte-identical.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/agent/osinstall"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// resign rewrites bundle file p's manifest with edit, signed again with the
// factory's key: a manifest that lies, as only the factory could sign one.
func resign(t *testing.T, rs *releases, p string, edit func(m *bundlefmt.Manifest)) {
	t.Helper()
	m, f, _ := openBundle(t, rs, p)
	h, err := bundlefmt.ReadHeader(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	edit(m)
	pemKey, err := os.ReadFile(rs.key)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := bundlefmt.ParsePrivateKey(pemKey)
	if err != nil {
		t.Fatal(err)
	}
	env, err := bundlefmt.Sign(m, priv)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := bundlefmt.EncodeHeader(env, h.Size)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt(hdr, 0); err != nil {
		t.Fatal(err)
	}
}

// ukiOf is the bundle's image for slot.
func ukiOf(t *testing.T, m *bundlefmt.Manifest, slot string) bundlefmt.UKIFile {
	t.Helper()
	for _, u := range m.OS.UKIs {
		if u.Slot == slot {
			return u
		}
	}
	t.Fatalf("the bundle has no unified kernel image for slot %s: %+v", slot, m.OS.UKIs)
	return bundlefmt.UKIFile{}
}

func TestImportOSSecureBoot(t *testing.T) {
	rs := newReleases(t)
	rs.slotBases(t)
	sbBase(t, filepath.Join(rs.dir, "ab-sb.raw"))
	keys, other := filepath.Join(rs.dir, "sb"), filepath.Join(rs.dir, "other-sb")
	rs.mustKiln(t, "key", "secureboot", keys)
	rs.mustKiln(t, "key", "secureboot", other)
	dbKey, dbCert := filepath.Join(keys, "db.key"), filepath.Join(keys, "db.crt")

	r10 := rs.recipeOn(t, "ab-sb.raw", "acme", "1.0.0", releaseFiles+"secureBoot:\n  keys: ../sb\n")
	disk10 := filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10, "--secure-boot-key", dbKey)
	r11 := rs.recipeOn(t, "ab-1.1.raw", "acme", "1.1.0", releaseFiles+"secureBoot:\n  keys: ../sb\n")
	rs.mustKiln(t, "lock", r11)
	b11 := filepath.Join(rs.dir, "upgrade-1.1.kiln")

	t.Run("a bundle of a Secure Boot recipe without the db key is a usage error", func(t *testing.T) {
		out, code := rs.kiln(t, "bundle", r11, "-o", filepath.Join(rs.dir, "nokey.kiln"), "--key", rs.key, "--from", disk10, "--format", "file")
		if code != 2 || !strings.Contains(out, "--secure-boot-key "+dbKey) {
			t.Errorf("exit %d:\n%s", code, out)
		}
		out, code = rs.kiln(t, "bundle", r11, "-o", filepath.Join(rs.dir, "nokey.kiln"), "--key", rs.key, "--from", disk10, "--format", "file", "--secure-boot-key", filepath.Join(other, "db.key"))
		if code != 1 || !strings.Contains(out, "does not match the recipe's db certificate") {
			t.Errorf("another factory's db key: exit %d:\n%s", code, out)
		}
		if _, err := os.Stat(filepath.Join(rs.dir, "nokey.kiln")); err == nil {
			t.Error("a bundle was written")
		}
	})

	rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key, "--from", disk10, "--format", "file", "--secure-boot-key", dbKey)
	m := readManifest(t, rs, b11)
	u := m.OS.Usr
	base := newOSNode(t, rs, disk10)
	slotA, slotB := base.slots.Slots[0], base.slots.Slots[1]
	const factoryEntries = "ignition-firstboot.efi kiln-1.0.efi"
	if got := base.entries(t); got != factoryEntries {
		t.Fatalf("the factory disk's entries: %q", got)
	}
	cmdline, _ := os.ReadFile(filepath.Join(base.root, osinstall.Cmdline))
	images := ""
	for _, f := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(f, contract.ImagesRootHashParam+"="); ok {
			images = v
		}
	}
	if images == "" {
		t.Fatalf("the factory image's command line has no %s=: %q", contract.ImagesRootHashParam, cmdline)
	}

	t.Run("the bundle carries a signed image for each slot", func(t *testing.T) {
		// A delta from the Secure Boot disk: its active slot read for what
		// its nodes hold, so the pack carries only the chunks 1.0 lacks.
		if m.Kind != bundlefmt.KindDelta || len(m.OS.Usr.Bases) != 1 || m.OS.Usr.Bases[0].Index == "" || m.OS.Usr.Pack == nil || m.OS.Usr.Pack.Size >= u.Size/2 {
			t.Errorf("kind %s, bases %+v, pack %+v of a %d-byte slot: want a delta against slot a of the disk", m.Kind, m.OS.Usr.Bases, m.OS.Usr.Pack, u.Size)
		}
		if len(m.OS.UKIs) != 2 {
			t.Fatalf("ukis %+v: want one for each slot", m.OS.UKIs)
		}
		rs.mustKiln(t, "verify", b11, "--key", rs.pub) // every file, the images included, against the manifest
		if out := rs.mustKiln(t, "inspect", b11); !strings.Contains(out, "Signed images (Secure Boot): slot a ") || !strings.Contains(out, ", slot b ") {
			t.Errorf("inspect does not list the signed images:\n%s", out)
		}
		_, f, fsStart := openBundle(t, rs, b11)
		defer f.Close()
		for _, sl := range []contract.OSSlot{slotA, slotB} {
			k := ukiOf(t, m, sl.Name)
			if k.ImagesRootHash != images {
				t.Errorf("slot %s: image partition root hash %s, want the factory disk's %s", sl.Name, k.ImagesRootHash, images)
			}
			off, size := fileAt(m, fsStart, bundlefmt.OSFile(k.Digest))
			local := filepath.Join(t.TempDir(), "uki.efi")
			copyRange(t, b11, off, size, local)
			run(t, "sbverify", "--cert", dbCert, local)
			s, err := uki.Read(local)
			if err != nil {
				t.Fatal(err)
			}
			uv, ok, err := bootentry.ParseUsrVerity(strings.Fields(s.Cmdline))
			if !ok || err != nil || uv.RootHash != u.Verity.RootHash || uv.DataPartUUID != sl.Usr.PartUUID || uv.HashPartUUID != sl.UsrVerity.PartUUID {
				t.Errorf("slot %s: the image mounts %+v (%v)", sl.Name, uv, err)
			}
		}
	})

	staged := base.copyOS(t)
	t.Run("the release's entry is its signed image with tries left", func(t *testing.T) {
		n := staged
		out := n.mustKiln(t, rs, "agent", "import", b11)
		t.Logf("the console:\n%s", out)
		for _, want := range []string{
			"os: slot b proven", "os: signed unified kernel image for slot b",
			"boot loader: entry kiln-1.1.0+3.efi of release 1.1.0 written, 3 tries", "release 1.1.0 is staged",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the console lacks %q", want)
			}
		}
		if got := n.entries(t); got != factoryEntries+" kiln-1.1.0+3.efi" {
			t.Errorf("entries %q", got)
		}
		entry := filepath.Join(n.esp(), "EFI/Linux/kiln-1.1.0+3.efi")
		run(t, "sbverify", "--cert", dbCert, entry)
		if d, err := bootloader.Digest(n.esp(), "EFI/Linux/kiln-1.1.0+3.efi"); err != nil || d != ukiOf(t, m, "b").Digest {
			t.Errorf("the entry is %s (%v), want the bundle's image for slot b", d, err)
		}
		s, err := uki.Read(entry)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := s.Param("usrhash"); v != u.Verity.RootHash {
			t.Errorf("usrhash=%s, want %s", v, u.Verity.RootHash)
		}
		if v, _ := s.Param(contract.ImagesRootHashParam); v != images {
			t.Errorf("%s=%s, want %s", contract.ImagesRootHashParam, v, images)
		}
		if v, _ := s.Param("systemd.verity_usr_data"); v != "PARTUUID="+slotB.Usr.PartUUID {
			t.Errorf("systemd.verity_usr_data=%s, want slot b's", v)
		}
		if _, err := os.Stat(filepath.Join(n.esp(), bootentry.FilePath(ukiOf(t, m, "b").Digest))); !os.IsNotExist(err) {
			t.Errorf("the image is still under %s as well (%v): it is renamed into place", bootentry.FileDir, err)
		}
		st := n.state(t)
		if st.Staged == nil || st.Staged.OS == nil || st.Staged.OS.UKI != ukiOf(t, m, "b").Digest || st.Staged.OS.Entry != "kiln-1.1.0" {
			t.Fatalf("staged %+v", st.Staged)
		}
		n.checkBootable(t)
	})

	t.Run("the upgrade boot tries and confirms 1.1 from its image", func(t *testing.T) {
		n := staged.copyOS(t)
		n.bootEntry(t, "kiln-1.1.0+3.efi")
		n.mustRelease(t, rs, "begin")
		if s := n.state(t); s.Trying == nil || s.Trying.Version != "1.1.0" {
			t.Fatalf("begin: %+v", s)
		}
		n.mustRelease(t, rs, "confirm", "1.1.0")
		if out := rs.mustKiln(t, "agent", "status", "--root", n.root); !strings.Contains(out, "booted:   kiln-1.1.0 (release 1.1.0, slot b)") {
			t.Errorf("status:\n%s", out)
		}
	})

	t.Run("its tries run out: the boot loader falls back and the image is removed", func(t *testing.T) {
		n := staged.copyOS(t)
		os.Rename(filepath.Join(n.esp(), "EFI/Linux/kiln-1.1.0+3.efi"), filepath.Join(n.esp(), "EFI/Linux/kiln-1.1.0+0-3.efi"))
		n.bootEntry(t, "kiln-1.0.efi")
		n.mustRelease(t, rs, "begin")
		if s := n.state(t); s.Staged != nil || s.Last == nil || s.Last.OK {
			t.Errorf("state %+v", s)
		}
		if got := n.entries(t); got != factoryEntries {
			t.Errorf("entries %q", got)
		}
	})

	refuse := func(t *testing.T, n *osNode, b string, want ...string) {
		t.Helper()
		before := n.snapshot(t)
		out, code := n.kiln(t, rs, "agent", "import", b)
		if code != 1 || !strings.Contains(out, "refused") || !strings.Contains(out, "nothing was changed") {
			t.Errorf("exit %d:\n%s", code, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("the refusal lacks %q:\n%s", w, out)
			}
		}
		if d := diffSnapshot(before, n.snapshot(t)); d != "" {
			t.Errorf("the refused bundle changed the node:\n%s", d)
		}
	}
	edited := func(t *testing.T, edit func(m *bundlefmt.Manifest)) string {
		p := filepath.Join(t.TempDir(), "b.kiln")
		copyFile(t, b11, p)
		resign(t, rs, p, edit)
		return p
	}

	t.Run("refused: a bundle without signed images", func(t *testing.T) {
		refuse(t, base.copyOS(t), edited(t, func(m *bundlefmt.Manifest) { m.OS.UKIs = nil }),
			"boots only unified kernel images signed for its Secure Boot db", "--secure-boot-key")
	})
	t.Run("refused: an image that is not the signed manifest's", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "b.kiln")
		copyFile(t, b11, p)
		_, f, fsStart := openBundle(t, rs, p)
		f.Close()
		off, size := fileAt(m, fsStart, bundlefmt.OSFile(ukiOf(t, m, "b").Digest))
		w, _ := os.OpenFile(p, os.O_RDWR, 0)
		b := make([]byte, 1)
		w.ReadAt(b, off+size/2)
		w.WriteAt([]byte{b[0] ^ 1}, off+size/2)
		w.Close()
		refuse(t, base.copyOS(t), p, "is damaged", "not the signed manifest's")
	})
	t.Run("refused: an image signed by another db", func(t *testing.T) {
		r := rs.recipeOn(t, "ab-1.1.raw", "acme", "1.1.0", releaseFiles+"secureBoot:\n  keys: ../other-sb\n")
		os.Rename(filepath.Dir(r), filepath.Join(rs.dir, "acme-1.1.0-other"))
		r = filepath.Join(rs.dir, "acme-1.1.0-other", "appliance.yaml")
		rs.mustKiln(t, "lock", r)
		p := filepath.Join(rs.dir, "other.kiln")
		rs.mustKiln(t, "bundle", r, "-o", p, "--key", rs.key, "--from", disk10, "--format", "file", "--secure-boot-key", filepath.Join(other, "db.key"))
		refuse(t, base.copyOS(t), p, "is not signed for this node's Secure Boot db", "signature does not verify")
	})
	t.Run("refused: an image whose usrhash is not the manifest's root hash", func(t *testing.T) {
		refuse(t, base.copyOS(t), edited(t, func(m *bundlefmt.Manifest) { m.OS.Usr.Verity.RootHash = strings.Repeat("ab", 32) }),
			"is signed with usrhash="+u.Verity.RootHash, "the signed manifest's /usr root hash is "+strings.Repeat("ab", 32))
	})
	t.Run("refused: an image for another image partition", func(t *testing.T) {
		n := base.copyOS(t)
		fake := strings.Repeat("cd", 32)
		p := filepath.Join(n.root, osinstall.Cmdline)
		os.WriteFile(p, []byte(strings.Replace(string(cmdline), images, fake, 1)), 0o644)
		refuse(t, n, b11, "no signed unified kernel image for slot b of a node whose image partition has root hash "+fake)
		refuse(t, n, edited(t, func(m *bundlefmt.Manifest) {
			for i := range m.OS.UKIs {
				m.OS.UKIs[i].ImagesRootHash = fake
			}
		}), "is signed with "+contract.ImagesRootHashParam+"="+images+", but this node's image partition has root hash "+fake)
	})
	t.Run("refused: the image of the other slot", func(t *testing.T) {
		refuse(t, base.copyOS(t), edited(t, func(m *bundlefmt.Manifest) {
			m.OS.UKIs[0].Slot, m.OS.UKIs[1].Slot = m.OS.UKIs[1].Slot, m.OS.UKIs[0].Slot
		}), "which this node writes for the slot")
	})

	t.Run("1.2 into slot a removes 1.0's images", func(t *testing.T) {
		n := staged.copyOS(t)
		n.bootEntry(t, "kiln-1.1.0+3.efi")
		n.mustRelease(t, rs, "begin")
		n.mustRelease(t, rs, "confirm", "1.1.0")
		r12 := rs.recipeOn(t, "ab-1.0.raw", "acme", "1.2.0", releaseFiles+"secureBoot:\n  keys: ../sb\n")
		rs.mustKiln(t, "lock", r12)
		b12 := filepath.Join(rs.dir, "upgrade-1.2.kiln")
		rs.mustKiln(t, "bundle", r12, "-o", b12, "--key", rs.key, "--from", disk10, "--from", b11, "--format", "file", "--secure-boot-key", dbKey)
		out := n.mustKiln(t, rs, "agent", "import", b12)
		if !strings.Contains(out, `into "usr-a" (slot a)`) {
			t.Errorf("the console:\n%s", out)
		}
		if got := n.entries(t); got != "kiln-1.1.0+3.efi kiln-1.2.0+3.efi" {
			t.Errorf("entries %q: want 1.0's (and the first-boot image, slot a's too) removed", got)
		}
		n.checkBootable(t)
	})

	t.Run("verify --booted holds the node's image to its signature and root hashes", func(t *testing.T) {
		// The factory disk as the node's import leaves it: slot b, and the
		// image in EFI/Linux.
		upgraded := func(t *testing.T, edit func(b []byte)) *upgradedDisk {
			d := &upgradedDisk{path: filepath.Join(t.TempDir(), "booted.raw")}
			copyFile(t, disk10, d.path)
			var err error
			if d.layout, err = gpt.Inspect(d.path); err != nil {
				t.Fatal(err)
			}
			for _, sp := range []contract.SlotPartition{slotB.Usr, slotB.UsrVerity} {
				p, _ := d.layout.Find(sp.Name)
				copyInto(t, staged.dev(sp), 0, d.path, p.Offset, p.Size)
			}
			b, err := os.ReadFile(filepath.Join(staged.esp(), "EFI/Linux/kiln-1.1.0+3.efi"))
			if err != nil {
				t.Fatal(err)
			}
			edit(b)
			d.espPut(t, "/EFI/Linux/kiln-1.1.0+3.efi", b)
			return d
		}
		d := upgraded(t, func([]byte) {})
		out := rs.mustKiln(t, "verify", "--booted", d.path)
		for _, w := range []string{"3 unified kernel images and 2 systemd-boot binaries signed for db", "OK",
			// the slot the node's image boots, proved as an entry's would be
			"(usr-b-verity): every block through dm-verity (root hash ", ", as entry kiln-1.1.0 (version 1.1) boots it)"} {
			if !strings.Contains(out, w) {
				t.Errorf("verify --booted lacks %q:\n%s", w, out)
			}
		}
		if strings.Contains(out, "no boot loader entry boots this slot") {
			t.Errorf("verify --booted does not see the slot the node's image boots:\n%s", out)
		}
		d = upgraded(t, func(b []byte) { b[len(b)/2] ^= 1 })
		out, code := rs.kiln(t, "verify", "--booted", d.path)
		if code != 1 || !strings.Contains(out, "EFI/Linux/kiln-1.1.0+3.efi") {
			t.Errorf("a changed byte in the node's image: exit %d:\n%s", code, out)
		}
	})

	t.Run("killed at every step and run again", func(t *testing.T) {
		killEverywhere(t, rs, base, staged, b11, factoryEntries, factoryEntries+" kiln-1.1.0+3.efi")
	})
}
