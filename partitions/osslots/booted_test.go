package osslots

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// bootedDisk is an A/B base with a real OS in slot a, as the factory wrote
// it, and kiln.json's record of it (what the build records).
type bootedDisk struct {
	path   string
	layout *gpt.Layout
	esp    gpt.Partition
	slots  *contract.OSSlots
}

func newBootedDisk(t *testing.T) *bootedDisk {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ab.raw")
	o := basedisk.OS{Version: "1.0", Usr: map[string][]byte{"lib/os-release": []byte("VERSION_ID=1.0\n")}, Kernel: []byte("the factory's kernel"), Initrd: []byte("the factory's initramfs")}
	if err := basedisk.Write(p, basedisk.WithABSlotsOS(8<<20, 8<<20, o)); err != nil {
		t.Fatal(err)
	}
	d, err := base.OpenDisk(p, "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, err := Read(d)
	if err != nil {
		t.Fatal(err)
	}
	if s.Boot, err = RecordBoot(d); err != nil {
		t.Fatal(err)
	}
	esp, _ := d.Layout.Find("EFI-SYSTEM")
	return &bootedDisk{path: p, layout: d.Layout, esp: *esp, slots: s}
}

func (d *bootedDisk) img() string { return fmt.Sprintf("%s@@%d", d.path, d.esp.Offset) }

// get and put read and write the file at p on the ESP (mtools).
func (d *bootedDisk) get(t *testing.T, p string) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), "file")
	run(t, "mcopy", "-n", "-i", d.img(), "::"+p, f)
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (d *bootedDisk) put(t *testing.T, p string, b []byte) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "mcopy", "-o", "-i", d.img(), f, "::"+p)
}

// check is CheckBooted of the disk with its ESP rewritten (changed: the
// slot partitions also rewritten, by name).
func (d *bootedDisk) check(slots *contract.OSSlots, changed ...string) (checked, unchecked []string, err error) {
	parts := []gpt.Partition{d.esp}
	for _, n := range changed {
		p, _ := d.layout.Find(n)
		parts = append(parts, *p)
	}
	return CheckBooted(context.Background(), d.path, d.layout, slots, parts, nil)
}

const factoryEntry = "/" + bootentry.Dir + "/" + basedisk.ABEntry + ".conf"

func TestCheckBootedEntries(t *testing.T) {
	d := newBootedDisk(t)
	orig := d.get(t, factoryEntry)
	usrA, usrB := strings.ToLower(basedisk.UsrAGUID), strings.ToLower(basedisk.UsrBGUID)
	usrAV, usrBV := strings.ToLower(basedisk.UsrAVerityGUID), strings.ToLower(basedisk.UsrBVerityGUID)
	replace := func(old, new string) func(string) string {
		if len(old) != len(new) {
			panic("not a same-length edit: " + old)
		}
		return func(s string) string {
			if !strings.Contains(s, old) {
				panic("the entry has no " + old)
			}
			return strings.Replace(s, old, new, 1)
		}
	}
	for _, tc := range []struct {
		name string
		edit func(string) string
		want string // in the error; "" passes
	}{
		{name: "unedited", edit: func(s string) string { return s }},
		{name: "init", edit: replace("root=LABEL=root", "init=/bin/sh   "), want: "its bytes (sha256:"},
		{name: "usrflags-rw", edit: replace("mount.usrflags=ro", "mount.usrflags=rw"), want: "its bytes (sha256:"},
		{name: "kernel-path", edit: replace("linux /kiln/1.0/vmlinuz", "linux /kiln/1.0/vmlinuX"), want: "its bytes (sha256:"},
		{name: "usrhash", edit: replace("usrhash="+d.slots.RootHash[:4], "usrhash=0000"), want: "with root hash 0000"},
		{name: "other-slot", edit: func(s string) string { return replace(usrAV, usrBV)(replace(usrA, usrB)(s)) },
			want: "boots /usr from PARTUUID " + usrB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.put(t, factoryEntry, []byte(tc.edit(string(orig))))
			defer d.put(t, factoryEntry, orig)
			checked, unchecked, err := d.check(d.slots)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				all := strings.Join(checked, "\n")
				for _, w := range []string{"entries kiln-1.0.conf, byte for byte", "the factory's kernel and initramfs /kiln/1.0/initrd.img, /kiln/1.0/vmlinuz, byte for byte"} {
					if !strings.Contains(all, w) {
						t.Errorf("checked lacks %q: %q", w, checked)
					}
				}
				if strings.Contains(strings.Join(unchecked, "\n"), "kiln-1.0") {
					t.Errorf("unchecked names the factory's entry: %q", unchecked)
				}
				return
			}
			wantBooted(t, err, factoryEntry, tc.want)
		})
	}

	t.Run("every-bit-flip", func(t *testing.T) {
		// One bit of each byte, a different bit each time (the entry is a
		// few hundred bytes): every one must fail, naming the file.
		defer d.put(t, factoryEntry, orig)
		for i := range orig {
			b := append([]byte(nil), orig...)
			b[i] ^= 1 << (i % 8)
			d.put(t, factoryEntry, b)
			_, _, err := d.check(d.slots)
			var be *BootedError
			if !errors.As(err, &be) || !strings.Contains(err.Error(), basedisk.ABEntry+".conf") {
				t.Errorf("byte %d (%q → %q): %v", i, orig[i], b[i], err)
			}
		}
	})

	t.Run("boot-counting-rename", func(t *testing.T) {
		counted := "/" + bootentry.Dir + "/" + basedisk.ABEntry + "+2-1.conf"
		run(t, "mren", "-i", d.img(), "::"+factoryEntry, "::"+counted)
		defer run(t, "mren", "-i", d.img(), "::"+counted, "::"+factoryEntry)
		checked, _, err := d.check(d.slots)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(checked, "\n"), "entries kiln-1.0+2-1.conf, byte for byte") {
			t.Errorf("checked: %q", checked)
		}
		// Its bytes changed under the counted name fail, naming that name.
		d.put(t, counted, []byte(replace("mount.usrflags=ro", "mount.usrflags=rw")(string(orig))))
		_, _, err = d.check(d.slots)
		wantBooted(t, err, counted, "its bytes (sha256:")
		d.put(t, counted, orig)
	})

	t.Run("factory-kernel-edited", func(t *testing.T) {
		k := d.get(t, "/kiln/1.0/vmlinuz")
		defer d.put(t, "/kiln/1.0/vmlinuz", k)
		d.put(t, "/kiln/1.0/vmlinuz", []byte(strings.ToUpper(string(k))))
		_, _, err := d.check(d.slots)
		wantBooted(t, err, "/kiln/1.0/vmlinuz", "kiln.json records the factory's sha256:")
	})

	t.Run("old-disk-without-record", func(t *testing.T) {
		old := *d.slots
		old.Boot = nil
		checked, unchecked, err := d.check(&old)
		if err != nil {
			t.Fatal(err)
		}
		if all := strings.Join(checked, "\n"); strings.Contains(all, "kiln-1.0") || strings.Contains(all, "vmlinuz") {
			t.Errorf("checked names what it cannot check: %q", checked)
		}
		if !strings.Contains(strings.Join(unchecked, "\n"), "boot loader entries kiln-1.0.conf: this disk's kiln.json records none") {
			t.Errorf("unchecked: %q", unchecked)
		}
	})
}

// wantBooted says err is a BootedError naming file with want in it.
func wantBooted(t *testing.T, err error, file, want string) {
	t.Helper()
	var be *BootedError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err %v, want a BootedError naming %s with %q", err, file, want)
	}
}

// The node's entries (none recorded) must be as the node writes them, and
// are never called ok; a string from one reaches the report quoted.
func TestCheckBootedNodeEntries(t *testing.T) {
	d := newBootedDisk(t)
	kernel := d.get(t, "/kiln/1.0/vmlinuz")
	kpath := bootentry.FilePath(fmt.Sprintf("sha256:%x", sha256.Sum256(kernel)))
	run(t, "mmd", "-i", d.img(), "::/kiln/sha256")
	d.put(t, kpath, kernel)
	usr, err := bootentry.UsrVerity{RootHash: d.slots.RootHash, DataPartUUID: strings.ToLower(basedisk.UsrBGUID),
		HashPartUUID: strings.ToLower(basedisk.UsrBVerityGUID), FSType: "squashfs"}.Options()
	if err != nil {
		t.Fatal(err)
	}
	e := bootentry.Entry{ID: "kiln-1.1.0", Title: "acme 1.1.0", Version: "1.1.0\x1b[2J\x1b]0;pwned\a", Linux: kpath, Options: append([]string{"rw"}, usr...)}
	var b strings.Builder
	if err := e.Encode(&b); err != nil {
		t.Fatal(err)
	}
	node := "/" + bootentry.Dir + "/kiln-1.1.0+3.conf"

	d.put(t, node, []byte(b.String()))
	_, unchecked, err := d.check(d.slots)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(unchecked, "\n"), "the kernel command line of boot loader entries kiln-1.1.0+3.conf: the node wrote them") {
		t.Errorf("unchecked: %q", unchecked)
	}

	// Slot b holds nothing: dm-verity fails, and the entry's version shows
	// quoted, never as the escape sequences it carries.
	_, _, err = d.check(d.slots, "usr-b", "usr-b-verity")
	if err == nil || strings.ContainsAny(err.Error(), "\x1b\a") || !strings.Contains(err.Error(), `(version "1.1.0\x1b[2J\x1b]0;pwned\a")`) {
		t.Errorf("an empty slot b: %v", err)
	}

	for name, text := range map[string]string{
		"a comment":      "# hi\n" + b.String(),
		"a factory file": strings.Replace(b.String(), kpath, "/kiln/1.0/vmlinuz", 1),
		"an unknown key": b.String() + "devicetree /x\n",
		"two spaces":     strings.Replace(b.String(), "options rw", "options  rw", 1),
	} {
		d.put(t, node, []byte(text))
		_, _, err := d.check(d.slots)
		var be *BootedError
		if !errors.As(err, &be) || !strings.Contains(err.Error(), "kiln-1.1.0+3.conf") || !strings.Contains(err.Error(), "not the factory's") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
