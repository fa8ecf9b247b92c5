//go:build !nodeonly

package main

// kiln verify --booted on a disk whose OS is in A/B slots, after an
// upgrade: the factory's 1.0 disk with what a node's import of 1.1 leaves
// (slot b holding the 1.1 base's slot, 1.1's kernel and initramfs on the
// ESP under their digests, its entry), then each way those parts can be
// damaged.

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// upgradedDisk is a copy of the factory disk as a node's import of the
// base at from (OS 1.1) into slot b leaves it; it returns the copy and
// the root hash of from's slot.
type upgradedDisk struct {
	path, rootHash string
	layout         *gpt.Layout
}

func upgradeOnHost(t *testing.T, factory, from string) *upgradedDisk {
	t.Helper()
	d := &upgradedDisk{path: filepath.Join(t.TempDir(), "booted.raw")}
	copyFile(t, factory, d.path)
	var err error
	if d.layout, err = gpt.Inspect(d.path); err != nil {
		t.Fatal(err)
	}
	fromDisk, err := base.OpenDisk(from, "")
	if err != nil || !fromDisk.Raw {
		t.Fatalf("%s: %v", from, err)
	}
	defer fromDisk.Close()
	fl := fromDisk.Layout
	s, e, err := osslots.ReadBoot(fromDisk)
	if err != nil {
		t.Fatal(err)
	}
	d.rootHash = s.RootHash
	for src, dst := range map[string]string{"usr-a": "usr-b", "usr-a-verity": "usr-b-verity"} {
		sp, _ := fl.Find(src)
		dp, _ := d.layout.Find(dst)
		copyInto(t, from, sp.Offset, d.path, dp.Offset, sp.Size)
	}
	// The boot files under their digests, and the entry, last.
	got, err := osslots.CopyFromESP(fromDisk, t.TempDir(), append([]string{e.Linux}, e.Initrd...))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range got {
		b, _ := os.ReadFile(f)
		p := bootentry.FilePath(fmt.Sprintf("sha256:%x", sha256.Sum256(b)))
		d.espPut(t, p, b)
		paths = append(paths, p)
	}
	usr, err := bootentry.UsrVerity{RootHash: d.rootHash, DataPartUUID: basedisk.UsrBGUID, HashPartUUID: basedisk.UsrBVerityGUID, FSType: "squashfs"}.Options()
	if err != nil {
		t.Fatal(err)
	}
	entry := bootentry.Entry{ID: "kiln-1.1.0", Title: "acme 1.1.0", Version: "1.1.0", Linux: paths[0], Initrd: paths[1:],
		Options: append([]string{"root=LABEL=root", "rw"}, usr...)}
	var b strings.Builder
	if err := entry.Encode(&b); err != nil {
		t.Fatal(err)
	}
	d.espPut(t, "/"+bootentry.Dir+"/kiln-1.1.0.conf", []byte(b.String()))
	d.espPut(t, "/loader/random-seed", []byte("the boot loader writes this on every boot"))
	return d
}

// espPut writes b at path p of the disk's ESP (mtools).
func (d *upgradedDisk) espPut(t *testing.T, p string, b []byte) {
	t.Helper()
	esp, _ := d.layout.Find("EFI-SYSTEM")
	img := fmt.Sprintf("%s@@%d", d.path, esp.Offset)
	src := filepath.Join(t.TempDir(), "file")
	os.WriteFile(src, b, 0o644)
	for _, dir := range []string{"/kiln", "/kiln/sha256"} {
		if strings.HasPrefix(p, dir+"/") {
			cmd := exec.Command("mmd", "-i", img, "::"+dir)
			cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
			cmd.Run() // exists already: fine
		}
	}
	cmd := exec.Command("mcopy", "-o", "-i", img, src, "::"+p)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
}

// espEdit replaces old with new in the file at path p of the disk's ESP.
func (d *upgradedDisk) espEdit(t *testing.T, p, old, new string) {
	t.Helper()
	esp, _ := d.layout.Find("EFI-SYSTEM")
	cmd := exec.Command("mtype", "-i", fmt.Sprintf("%s@@%d", d.path, esp.Offset), "::"+p)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	b, err := cmd.Output()
	if err != nil || !strings.Contains(string(b), old) {
		t.Fatalf("%s: %v: %q", cmd, err, b)
	}
	d.espPut(t, p, []byte(strings.Replace(string(b), old, new, 1)))
}

// espRename renames the file at path p of the disk's ESP to q, as
// systemd-boot does when it counts a try.
func (d *upgradedDisk) espRename(t *testing.T, p, q string) {
	t.Helper()
	esp, _ := d.layout.Find("EFI-SYSTEM")
	cmd := exec.Command("mren", "-i", fmt.Sprintf("%s@@%d", d.path, esp.Offset), "::"+p, "::"+q)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
}

// espDel removes the file at path p of the disk's ESP (mtools).
func (d *upgradedDisk) espDel(t *testing.T, p string) {
	t.Helper()
	esp, _ := d.layout.Find("EFI-SYSTEM")
	cmd := exec.Command("mdel", "-i", fmt.Sprintf("%s@@%d", d.path, esp.Offset), "::"+p)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
}

// flip inverts one byte at off of partition name.
func (d *upgradedDisk) flip(t *testing.T, name string, off int64) {
	t.Helper()
	p, _ := d.layout.Find(name)
	f, err := os.OpenFile(d.path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	f.ReadAt(b, p.Offset+off)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, p.Offset+off); err != nil {
		t.Fatal(err)
	}
}

// copyInto copies n bytes at off of src to at of dst.
func copyInto(t *testing.T, src string, off int64, dst string, at, n int64) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(io.NewOffsetWriter(out, at), io.NewSectionReader(in, off, n)); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyBootedSlots(t *testing.T) {
	rs := newReleases(t)
	rs.slotBases(t)
	disk10 := filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", rs.recipeOn(t, "ab-1.0.raw", "acme", "1.0.0", releaseFiles), "-o", disk10)
	ab11 := filepath.Join(rs.dir, "ab-1.1.raw")

	for _, tc := range []struct {
		name    string
		damage  func(t *testing.T, d *upgradedDisk)
		booted  bool
		code    int
		want    []string // in the output, in any order
		without []string
	}{
		{name: "upgraded", booted: true, want: []string{
			"ok           partition 6 (usr-b) and 7 (usr-b-verity): every block through dm-verity (root hash @H11@, as entry kiln-1.1.0 (version 1.1.0) boots it)",
			"ok           partition 2 (EFI-SYSTEM): boot loader entries kiln-1.0.conf, byte for byte as the factory wrote them (kiln.json)",
			"ok           partition 2 (EFI-SYSTEM): the 2 kernel and initramfs files the entries name under /kiln/sha256, each against the sha256 it is named by",
			"ok           partition 2 (EFI-SYSTEM): the factory's kernel and initramfs /kiln/1.0/initrd.img, /kiln/1.0/vmlinuz, byte for byte as kiln.json records them",
			"not checked  partition 2 (EFI-SYSTEM): the kernel command line of boot loader entries kiln-1.1.0.conf: the node wrote them from a signed bundle",
			"ok           partition 4 (usr-a)",
			"not checked  partition 2 (EFI-SYSTEM): its other files",
			": OK, except what is not checked above",
		}},
		{name: "not-booted", code: 1, want: []string{
			"differs from what the build wrote", "(if this disk has booted, run kiln verify --booted)",
		}},
		{name: "slot-block-flipped", booted: true, code: 1, damage: func(t *testing.T, d *upgradedDisk) { d.flip(t, "usr-b", 4096*3+17) },
			want: []string{"partition 6 (usr-b) and 7 (usr-b-verity): fails dm-verity against root hash @H11@, with which entry kiln-1.1.0 (version 1.1.0) boots it"}},
		{name: "hash-tree-flipped", booted: true, code: 1, damage: func(t *testing.T, d *upgradedDisk) { d.flip(t, "usr-b-verity", 4096+5) },
			want: []string{"partition 6 (usr-b) and 7 (usr-b-verity): fails dm-verity"}},
		{name: "factory-slot-flipped", booted: true, code: 1, damage: func(t *testing.T, d *upgradedDisk) { d.flip(t, "usr-a", 4096*2) },
			want: []string{"partition 4 (usr-a) and 5 (usr-a-verity): fails dm-verity", "entry kiln-1.0 (version 1.0) boots it"}},
		{name: "boot-file-damaged", booted: true, code: 1, damage: func(t *testing.T, d *upgradedDisk) {
			esp, _ := d.layout.Find("EFI-SYSTEM")
			cmd := exec.Command("mdir", "-b", "-i", fmt.Sprintf("%s@@%d", d.path, esp.Offset), "::/kiln/sha256")
			cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			first := strings.Fields(string(out))[0]
			d.espPut(t, strings.TrimPrefix(first, "::"), []byte("not the kernel"))
		}, want: []string{"partition 2 (EFI-SYSTEM): /kiln/sha256/", "holds bytes whose sha256 is"}},
		{name: "factory-entry-edited", booted: true, code: 1, damage: func(t *testing.T, d *upgradedDisk) {
			d.espEdit(t, "/"+bootentry.Dir+"/kiln-1.0.conf", "mount.usrflags=ro", "mount.usrflags=rw")
		}, want: []string{"partition 2 (EFI-SYSTEM): /loader/entries/kiln-1.0.conf: its bytes (sha256:", "are not the ones the factory wrote for entry kiln-1.0"}},
		{name: "factory-entry-to-other-slot", booted: true, code: 1, damage: func(t *testing.T, d *upgradedDisk) {
			d.espEdit(t, "/"+bootentry.Dir+"/kiln-1.0.conf", strings.ToLower(basedisk.UsrAGUID), strings.ToLower(basedisk.UsrBGUID))
		}, want: []string{"/loader/entries/kiln-1.0.conf: boots /usr from PARTUUID " + strings.ToLower(basedisk.UsrBGUID)}},
		{name: "factory-entry-counted", booted: true, damage: func(t *testing.T, d *upgradedDisk) {
			d.espRename(t, "/"+bootentry.Dir+"/kiln-1.0.conf", "/"+bootentry.Dir+"/kiln-1.0+2-1.conf")
		}, want: []string{"ok           partition 2 (EFI-SYSTEM): boot loader entries kiln-1.0+2-1.conf, byte for byte"}},
		{name: "factory-kernel-edited", booted: true, code: 1, damage: func(t *testing.T, d *upgradedDisk) {
			d.espPut(t, "/kiln/1.0/vmlinuz", []byte("not the factory's kernel"))
		}, want: []string{"partition 2 (EFI-SYSTEM): /kiln/1.0/vmlinuz holds bytes whose digest is"}},
		{name: "slot-written-not-booted", booted: true, damage: func(t *testing.T, d *upgradedDisk) {
			d.espDel(t, "/"+bootentry.Dir+"/kiln-1.1.0.conf")
		}, want: []string{
			"not checked  partition 6 (usr-b) and 7 (usr-b-verity): no boot loader entry boots this slot",
			": OK, except what is not checked above",
		}, without: []string{"kiln-1.1.0"}},
		{name: "factory-slot-rewritten-in-part", booted: true, damage: func(t *testing.T, d *upgradedDisk) {
			// As an import into slot a leaves it before its entry exists:
			// usr-a's bytes changed, its hash partition as built.
			p, _ := d.layout.Find("usr-a")
			d.flip(t, "usr-a", p.Size-1)
			d.espDel(t, "/"+bootentry.Dir+"/kiln-1.0.conf")
		}, want: []string{
			"not checked  partition 4 (usr-a): no boot loader entry boots this slot",
			"ok           partition 5 (usr-a-verity)\n",
			"ok           partition 6 (usr-b) and 7 (usr-b-verity): every block through dm-verity",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := upgradeOnHost(t, disk10, ab11)
			if tc.damage != nil {
				tc.damage(t, d)
			}
			args := []string{"verify", d.path}
			if tc.booted {
				args = append(args, "--booted")
			}
			out, code := rs.kiln(t, args...)
			if testing.Verbose() {
				t.Log(out)
			}
			if code != tc.code {
				t.Fatalf("kiln %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, tc.code, out)
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "@H11@", d.rootHash); !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.without {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}
}
