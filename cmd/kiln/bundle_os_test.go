//go:build !nodeonly

package main

// Black-box tests of the bundle's OS section: bases whose OS is in A/B
// slots (a real squashfs in usr-a, its hash tree by veritysetup, kernel and
// initramfs on the ESP), a factory disk of 1.0, and bundles of 1.1 (a
// changed OS) and 1.2 (the same OS as 1.1).

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/agent/slotwrite"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// osOf is a release's OS for the A/B bases: 1.1 gains a program and a
// library changes a little; the kernel is the same in both, the initramfs
// is not.
func osOf(version string) basedisk.OS {
	random := func(seed uint64, n int) []byte {
		r := rand.New(rand.NewPCG(seed, 1))
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	o := basedisk.OS{
		Version: version,
		Usr: map[string][]byte{
			"lib/os-release":    []byte("ID=acme\nVERSION_ID=" + version + "\n"),
			"lib/libacme.so.1":  random(1, 1<<20),
			"lib/libother.so.2": random(2, 768<<10),
			"bin/sh":            random(3, 256<<10),
		},
		Kernel: random(10, 300<<10),
		Initrd: append([]byte("initramfs "+version+"\n"), random(11, 200<<10)...),
	}
	if version != "1.0" {
		o.Usr["bin/jq"] = random(4, 200<<10)
		lib := o.Usr["lib/libother.so.2"]
		copy(lib[300<<10:], "patched")
	}
	return o
}

// slotBases writes the A/B bases of OS 1.0 and 1.1 into rs.dir.
func (rs *releases) slotBases(t *testing.T) {
	t.Helper()
	for _, v := range []string{"1.0", "1.1"} {
		if err := basedisk.Write(filepath.Join(rs.dir, "ab-"+v+".raw"), basedisk.WithABSlotsOS(8<<20, 8<<20, osOf(v))); err != nil {
			t.Fatal(err)
		}
	}
}

// recipeOn is rs.recipe on another base of rs.dir.
func (rs *releases) recipeOn(t *testing.T, base, name, version, extra string) string {
	t.Helper()
	p := rs.recipe(t, name, version, extra)
	y, _ := os.ReadFile(p)
	os.WriteFile(p, []byte(strings.Replace(string(y), "/base.raw\n", "/"+base+"\n", 1)), 0o644)
	return p
}

// openBundle opens a bundle as the node does (signature, manifest,
// filesystem, OS section) and returns it with where its filesystem starts.
func openBundle(t *testing.T, rs *releases, p string) (*bundlefmt.Manifest, *os.File, int64) {
	t.Helper()
	rep := inspectBundle(t, rs, p)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	pubPEM, _ := os.ReadFile(rs.pub)
	pub, err := bundlefmt.ParsePublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	part := io.NewSectionReader(f, rep.Offset, rep.Size-rep.Offset)
	m, h, _, err := bundlefmt.Open(part, []ed25519.PublicKey{pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckFilesystem(part, h.Size, nil); err != nil {
		t.Fatal(err)
	}
	return m, f, rep.Offset + h.Size
}

// fileAt is where a file of the bundle's filesystem starts in the bundle.
func fileAt(m *bundlefmt.Manifest, fsStart int64, path string) (int64, int64) {
	i := slices.IndexFunc(m.Files, func(f bundlefmt.File) bool { return f.Path == path })
	return fsStart + m.Files[i].Offset, m.Files[i].Size
}

// writeSlot writes the bundle's slot as a node of the release of
// m.OS.Usr.Bases[base] does, seeded from active (its usr-a; nil, with any
// base: a node with nothing to seed from), and seals it with the signed verity
// values: the proof that the factory's index, pack and values make exactly
// the new release's slot.
func writeSlot(t *testing.T, m *bundlefmt.Manifest, b io.ReaderAt, fsStart int64, active io.ReaderAt, base int) (slotwrite.Stats, string, error) {
	t.Helper()
	u := m.OS.Usr
	x, bases, err := m.CheckOS(io.NewSectionReader(b, fsStart, m.Filesystem.Size), 0)
	if err != nil {
		return slotwrite.Stats{}, "", err
	}
	src := slotwrite.Source{Index: x, Active: active, PackBases: bases}
	if base < len(bases) {
		src.Base = bases[base]
	}
	if u.Pack != nil {
		off, n := fileAt(m, fsStart, bundlefmt.OSFile(u.Pack.Digest))
		src.Pack = io.NewSectionReader(b, off, n)
	}
	dir := t.TempDir()
	data, hash := filepath.Join(dir, "usr-b"), filepath.Join(dir, "usr-b-verity")
	os.WriteFile(hash, make([]byte, 1<<20), 0o644)
	dst, err := os.Create(data)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := dst.Truncate(8 << 20); err != nil {
		t.Fatal(err)
	}
	stats, err := slotwrite.Write(context.Background(), dst, 8<<20, src)
	if err != nil {
		return stats, "", err
	}
	dst.Close()
	return stats, data, slotwrite.Seal(context.Background(), data, hash, u.Verity)
}

// usrA is the active usr partition of a disk.
func usrA(t *testing.T, disk string) *io.SectionReader {
	t.Helper()
	l, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := l.Find("usr-a")
	if !ok {
		t.Fatalf("%s has no usr-a", disk)
	}
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return io.NewSectionReader(f, p.Offset, p.Size)
}

func TestBundleOSSlot(t *testing.T) {
	rs := newReleases(t)
	rs.slotBases(t)
	r10 := rs.recipeOn(t, "ab-1.0.raw", "acme", "1.0.0", releaseFiles)
	r11 := rs.recipeOn(t, "ab-1.1.raw", "acme", "1.1.0", releaseFiles)
	r12 := rs.recipeOn(t, "ab-1.1.raw", "acme", "1.2.0", releaseFiles)
	disk10 := filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10)
	rs.mustKiln(t, "lock", r11)
	rs.mustKiln(t, "lock", r12)

	b11 := filepath.Join(rs.dir, "upgrade-1.1.img")
	out := rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key, "--from", disk10)
	if !strings.Contains(out, "read the base's OS slot: done") {
		t.Errorf("a base with slots: no progress of reading its slot:\n%s", out)
	}
	m, f, fsStart := openBundle(t, rs, b11)
	u, e := m.OS.Usr, m.OS.Entry

	t.Run("a changed OS carries only what the base lacks", func(t *testing.T) {
		if m.SchemaVersion != bundlefmt.OSSchemaVersion {
			t.Errorf("schema %d", m.SchemaVersion)
		}
		if u.Pack == nil || u.Pack.Size >= u.Size/2 {
			t.Fatalf("pack %+v for a slot of %d bytes: want some chunks, far fewer than the slot's", u.Pack, u.Size)
		}
		if len(u.Bases) != 1 || u.Bases[0].Index == "" || u.Bases[0].Version != "1.0.0" {
			t.Errorf("bases %+v: want 1.0.0's index, cut from its disk", u.Bases)
		}
		if e.Version != "1.1" || e.Kernel.OnStick || len(e.Initrd) != 1 || !e.Initrd[0].OnStick {
			t.Errorf("boot entry %+v: want 1.1, the kernel left out (1.0 boots the same), the initramfs on the stick", e)
		}
		for _, o := range e.Options {
			if bundlefmt.IsUsrVerityOption(o) {
				t.Errorf("the entry's options keep %s", o)
			}
		}
		for _, want := range []string{"OS: usr slot ", "of its chunks on the stick, the rest from the node's active slot", "Boot entry: version 1.1, kernel vmlinuz 300.0 KiB (the node's own), initramfs initrd.img"} {
			if !strings.Contains(out, want) {
				t.Errorf("bundle output lacks %q:\n%s", want, out)
			}
		}
		if out := rs.mustKiln(t, "inspect", b11); !strings.Contains(out, "\nOS: usr slot ") || !strings.Contains(out, "\nBoot entry: version 1.1") {
			t.Errorf("inspect shows no OS section:\n%s", out)
		}
		rs.mustKiln(t, "verify", b11, "--key", rs.pub)
	})

	t.Run("a node of 1.0 writes exactly 1.1's slot from it", func(t *testing.T) {
		stats, data, err := writeSlot(t, m, f, fsStart, usrA(t, disk10), 0)
		if err != nil {
			t.Fatal(err)
		}
		if stats.Packed != u.Pack.Size || stats.Seeded == 0 {
			t.Errorf("stats %+v: want the pack's %d bytes from the stick, the rest seeded", stats, u.Pack.Size)
		}
		got, _ := os.ReadFile(data)
		want := make([]byte, u.Size)
		usrA(t, filepath.Join(rs.dir, "ab-1.1.raw")).ReadAt(want, 0)
		if string(got[:u.Size]) != string(want) {
			t.Error("the written slot differs from 1.1's base")
		}
	})

	t.Run("an unchanged OS costs nothing", func(t *testing.T) {
		b12 := filepath.Join(rs.dir, "upgrade-1.2.img")
		out := rs.mustKiln(t, "bundle", r12, "-o", b12, "--key", rs.key, "--from", b11)
		m12, f12, fs12 := openBundle(t, rs, b12)
		o := m12.OS
		if o.Usr.Pack != nil || o.Entry.Kernel.OnStick || o.Entry.Initrd[0].OnStick {
			t.Errorf("OS %+v: want no pack, no boot file on the stick", o)
		}
		if o.Usr.Index != u.Index || o.Usr.Bases[0].Index != u.Index || o.Usr.Verity != u.Verity {
			t.Errorf("the same slot is described differently: %+v, was %+v", o.Usr, u)
		}
		var osFiles []string
		for _, f := range m12.Files {
			if strings.HasPrefix(f.Path, bundlefmt.OSBlobDir) {
				osFiles = append(osFiles, f.Path)
			}
		}
		if !slices.Equal(osFiles, []string{bundlefmt.OSFile(u.Index)}) {
			t.Errorf("the OS section's files on the stick: %v, want only the slot's index", osFiles)
		}
		if !strings.Contains(out, "none of its chunks on the stick") {
			t.Errorf("bundle output:\n%s", out)
		}
		// A node of 1.1 (whose slot is 1.1's) writes it from its own.
		if _, _, err := writeSlot(t, m12, f12, fs12, usrA(t, filepath.Join(rs.dir, "ab-1.1.raw")), 0); err != nil {
			t.Fatal(err)
		}
		rs.mustKiln(t, "verify", b12, "--key", rs.pub)
	})

	t.Run("one delta for nodes of 1.0 and of 1.1", func(t *testing.T) {
		both := filepath.Join(rs.dir, "upgrade-1.2-both.img")
		rs.mustKiln(t, "bundle", r12, "-o", both, "--key", rs.key, "--from", disk10, "--from", b11)
		mb, fb, fsb := openBundle(t, rs, both)
		o := mb.OS
		if len(o.Usr.Bases) != 2 || o.Usr.Pack == nil || *o.Usr.Pack != *u.Pack || !o.Entry.Initrd[0].OnStick || o.Entry.Kernel.OnStick {
			t.Errorf("OS %+v: want 1.0's pack and initramfs (1.1's nodes lack nothing), the kernel left out", o)
		}
		for i, disk := range []string{disk10, filepath.Join(rs.dir, "ab-1.1.raw")} {
			stats, _, err := writeSlot(t, mb, fb, fsb, usrA(t, disk), i)
			if err != nil {
				t.Errorf("a node of %s: %v", o.Usr.Bases[i].Version, err)
			}
			if i == 1 && stats.Packed != 0 {
				t.Errorf("a node of 1.1 took %d bytes from the pack: its slot holds every chunk", stats.Packed)
			}
		}
	})

	t.Run("a full bundle carries the whole slot and the boot files", func(t *testing.T) {
		full := filepath.Join(rs.dir, "full-1.1.img")
		rs.mustKiln(t, "bundle", r11, "-o", full, "--key", rs.key, "--format", "file")
		mf, ff, fsf := openBundle(t, rs, full)
		if mf.OS.Usr.Pack == nil || len(mf.OS.Usr.Bases) != 0 || !mf.OS.Entry.Kernel.OnStick || !mf.OS.Entry.Initrd[0].OnStick {
			t.Fatalf("full bundle's OS: %+v", mf.OS)
		}
		if _, _, err := writeSlot(t, mf, ff, fsf, nil, 0); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("every kind of base says what its nodes hold", func(t *testing.T) {
		// 1.0's lock, its recipe beside it: the recipe's base is cut as
		// the disk was.
		fromLock := filepath.Join(rs.dir, "from-lock.img")
		rs.mustKiln(t, "bundle", r11, "-o", fromLock, "--key", rs.key, "--from", strings.TrimSuffix(r10, ".yaml")+".lock")
		ml, _, _ := openBundle(t, rs, fromLock)
		if ml.OS.Usr.Bases[0].Index != u.Bases[0].Index || *ml.OS.Usr.Pack != *u.Pack || ml.OS.Entry.Kernel.OnStick {
			t.Errorf("from the lock: %+v, from the disk: %+v", ml.OS.Usr, u)
		}
		// 1.0's kiln.json names only its slot's root hash: 1.1's differs,
		// so the pack carries every chunk, and the kernel.
		var rep struct {
			Contents json.RawMessage `json:"contents"`
		}
		if err := json.Unmarshal([]byte(rs.mustKiln(t, "inspect", "-o", "json", disk10)), &rep); err != nil {
			t.Fatal(err)
		}
		kj := filepath.Join(rs.dir, "kiln-1.0.json")
		os.WriteFile(kj, rep.Contents, 0o644)
		fromJSON := filepath.Join(rs.dir, "from-json.img")
		rs.mustKiln(t, "bundle", r11, "-o", fromJSON, "--key", rs.key, "--from", kj)
		mj, fj, fsj := openBundle(t, rs, fromJSON)
		if mj.OS.Usr.Bases[0].Index != "" || mj.OS.Usr.Pack.Size <= u.Pack.Size || !mj.OS.Entry.Kernel.OnStick {
			t.Errorf("from a kiln.json: %+v, kernel on the stick: %v", mj.OS.Usr, mj.OS.Entry.Kernel.OnStick)
		}
		if _, _, err := writeSlot(t, mj, fj, fsj, usrA(t, disk10), 0); err != nil {
			t.Errorf("a node of 1.0 writes the slot from a delta made from its kiln.json: %v", err)
		}
		// Nodes whose agent reads no OS section (a kiln.json without the
		// kiln record: before schema 2) are told, not sent one.
		var c map[string]json.RawMessage
		json.Unmarshal(rep.Contents, &c)
		delete(c, "kiln")
		b, _ := json.Marshal(c)
		os.WriteFile(kj, b, 0o644)
		out, code := rs.kiln(t, "bundle", r11, "-o", filepath.Join(rs.dir, "old.img"), "--key", rs.key, "--from", kj)
		if want := "its nodes run an agent that reads bundle schemas up to 1, and the OS of acme 1.1.0 needs schema 3"; code != 1 || !strings.Contains(out, want) {
			t.Errorf("--from an old kiln.json: exit %d, want 1 saying %q:\n%s", code, want, out)
		}
		// A compressed base gives the same section as the raw one.
		zst := filepath.Join(rs.dir, "ab-1.1.raw.zst")
		if err := basedisk.Compress(filepath.Join(rs.dir, "ab-1.1.raw"), zst, "zstd"); err != nil {
			t.Fatal(err)
		}
		rz := rs.recipeOn(t, "ab-1.1.raw.zst", "acme-zst", "1.1.0", releaseFiles)
		y, _ := os.ReadFile(rz)
		os.WriteFile(rz, []byte(strings.Replace(string(y), "name: acme-zst", "name: acme", 1)), 0o644)
		lock, err := os.ReadFile(strings.TrimSuffix(r11, ".yaml") + ".lock")
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(strings.TrimSuffix(rz, ".yaml")+".lock", lock, 0o644)
		fromZst := filepath.Join(rs.dir, "zst.img")
		rs.mustKiln(t, "bundle", rz, "-o", fromZst, "--key", rs.key, "--from", disk10)
		mz, _, _ := openBundle(t, rs, fromZst)
		if !reflect.DeepEqual(mz.OS, m.OS) {
			t.Errorf("from a zstd base: %+v\nfrom the raw one: %+v", mz.OS, m.OS)
		}
	})

	t.Run("a tampered index or pack is refused", func(t *testing.T) {
		for _, tc := range []struct {
			name, path string
			at         int64
		}{
			{"index", bundlefmt.OSFile(u.Index), 60},
			{"pack", bundlefmt.OSFile(u.Pack.Digest), u.Pack.Size / 2},
		} {
			bad := filepath.Join(t.TempDir(), "bad.img")
			b, _ := os.ReadFile(b11)
			off, _ := fileAt(m, fsStart, tc.path)
			b[off+tc.at] ^= 1
			os.WriteFile(bad, b, 0o644)
			out, code := rs.kiln(t, "verify", bad, "--key", rs.pub)
			if code != 1 || !strings.Contains(out, tc.path) {
				t.Errorf("%s: verify exit %d, want 1 naming %s:\n%s", tc.name, code, tc.path, out)
			}
			bf, _ := os.Open(bad)
			defer bf.Close()
			_, _, err := writeSlot(t, m, bf, fsStart, usrA(t, disk10), 0)
			if !errors.Is(err, bundlefmt.ErrDamaged) && !errors.Is(err, contract.ErrDamaged) {
				t.Errorf("%s: the node's write: %v, want it refused as damaged", tc.name, err)
			}
		}
	})

	t.Run("the base the recipe pins, or none", func(t *testing.T) {
		pinned := rs.recipeOn(t, "ab-1.1.raw", "acme-pinned", "1.1.0", releaseFiles)
		y, _ := os.ReadFile(pinned)
		wrong := "sha256:" + strings.Repeat("0", 64)
		os.WriteFile(pinned, []byte(strings.Replace(string(y), "/ab-1.1.raw\n", "/ab-1.1.raw\n  digest: "+wrong+"\n", 1)), 0o644)
		rs.mustKiln(t, "lock", pinned)
		out, code := rs.kiln(t, "bundle", pinned, "-o", filepath.Join(rs.dir, "pinned.img"), "--key", rs.key)
		if want := "base.digest: base image " + filepath.Join(rs.dir, "ab-1.1.raw") + " has digest sha256:" + sha256File(t, filepath.Join(rs.dir, "ab-1.1.raw")) + ", but the recipe expects " + wrong; code != 1 || !strings.Contains(out, want) {
			t.Errorf("a base that is not the pinned one: exit %d, want 1 saying %q:\n%s", code, want, out)
		}
	})

	t.Run("nodes without slots cannot take an OS", func(t *testing.T) {
		plain := filepath.Join(rs.dir, "plain-1.0.raw")
		rs.mustKiln(t, "build", rs.recipe(t, "acme", "1.0.0", releaseFiles), "-o", plain)
		out, code := rs.kiln(t, "bundle", r11, "-o", filepath.Join(rs.dir, "x.img"), "--key", rs.key, "--from", plain)
		if code != 1 || !strings.Contains(out, fmt.Sprintf("--from %s: its nodes have no OS slots", plain)) {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})
}
