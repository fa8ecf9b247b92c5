//go:build !nodeonly

package main

// Black-box tests of a Secure Boot build: the A/B base of the bundle
// tests with systemd-boot and a first-boot entry on its ESP, built with a
// recipe's secureBoot and kiln key secureboot's keys; the disk's ESP read
// back with the real tools (sbverify, mtools, fsck.vfat, sgdisk).

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/partitions/esp"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// espOfDisk is the ESP of the disk file p.
func espOfDisk(t testing.TB, p string) (esp.FS, gpt.Partition) {
	t.Helper()
	l, err := gpt.Inspect(p)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := l.Find("EFI-SYSTEM")
	if !ok {
		t.Fatalf("%s has no EFI-SYSTEM partition", p)
	}
	return esp.FS{Disk: p, Offset: e.Offset}, *e
}

// sbBase writes the A/B base of OS 1.0 with what a Debian 12 base's ESP
// has besides: systemd-boot in its place and as the fallback loader, the
// one-shot first-boot entry and a loader.conf that boots it first. opts
// replace the base's layout and OS (the benchmark's real-sized ones); none
// is basedisk.WithABSlotsOS of 8 MiB slots and osOf("1.0").
func sbBase(t testing.TB, p string, opts ...basedisk.Option) {
	t.Helper()
	if len(opts) == 0 {
		opts = []basedisk.Option{basedisk.WithABSlotsOS(8<<20, 8<<20, osOf("1.0"))}
	}
	if err := basedisk.Write(p, opts...); err != nil {
		t.Fatal(err)
	}
	fs, _ := espOfDisk(t, p)
	for _, dst := range []string{"EFI/systemd/systemd-bootx64.efi", "EFI/BOOT/BOOTX64.EFI"} {
		if err := fs.CopyIn(copyOf(t, uki.SystemdBoot), dst); err != nil {
			t.Fatal(err)
		}
	}
	entry, err := fs.Read("loader/entries/"+basedisk.ABEntry+".conf", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var first []string
	for _, l := range strings.Split(strings.TrimSpace(string(entry)), "\n") {
		switch {
		case strings.HasPrefix(l, "version "):
			continue
		case strings.HasPrefix(l, "title "):
			l += " (Ignition first boot)"
		case strings.HasPrefix(l, "options "):
			l += " ignition.firstboot"
		}
		first = append(first, l)
	}
	for name, data := range map[string]string{
		"loader/entries/ignition-firstboot.conf": strings.Join(first, "\n") + "\n",
		"loader/loader.conf":                     "timeout 0\ndefault ignition-firstboot.conf\neditor no\n",
	} {
		if err := fs.Write(name, []byte(data), t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
}

// checkEnrolment checks that the ESP of sbBase's disk (or stick) enrols
// the keys in keys: loader.conf says so, loader/keys/auto holds the three
// .auth files only.
func checkEnrolment(t *testing.T, fs esp.FS, keys string) {
	t.Helper()
	tmp := t.TempDir()
	conf, err := fs.Read("loader/loader.conf", tmp)
	if err != nil {
		t.Fatal(err)
	}
	if want := "timeout 0\ndefault ignition-firstboot.efi\neditor no\nsecure-boot-enroll force\n"; string(conf) != want {
		t.Errorf("loader.conf:\n%s\nwant:\n%s", conf, want)
	}
	for _, name := range []string{"PK", "KEK", "db"} {
		got, err := fs.Read("loader/keys/auto/"+name+".auth", tmp)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := os.ReadFile(filepath.Join(keys, name+".auth")); !bytes.Equal(got, want) {
			t.Errorf("loader/keys/auto/%s.auth differs from %s's", name, keys)
		}
	}
	names, _ := fs.List("loader/keys/auto")
	if strings.Join(names, " ") != "PK.auth KEK.auth db.auth" && len(names) != 3 {
		t.Errorf("loader/keys/auto holds %v, want the three .auth files only", names)
	}
}

// copyOf copies a file into the test's temporary directory (esp.FS sets
// the times of what it copies in).
func copyOf(t testing.TB, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func cloneFile(t *testing.T, src, dst string) {
	t.Helper()
	run(t, "cp", "--sparse=always", src, dst)
}

func TestBuildSecureBoot(t *testing.T) {
	rs := newReleases(t)
	sbBase(t, filepath.Join(rs.dir, "ab-sb.raw"))
	if err := basedisk.Write(filepath.Join(rs.dir, "ab-plain.raw"), basedisk.WithABSlotsOS(8<<20, 8<<20, osOf("1.0"))); err != nil {
		t.Fatal(err)
	}
	keys, other := filepath.Join(rs.dir, "sb"), filepath.Join(rs.dir, "other-sb")
	rs.mustKiln(t, "key", "secureboot", keys)
	rs.mustKiln(t, "key", "secureboot", other)
	const section = "secureBoot:\n  keys: ../sb\n"
	r := rs.recipeOn(t, "ab-sb.raw", "acme", "1.0.0", section)
	disk := filepath.Join(rs.dir, "disk.raw")
	dbKey := filepath.Join(keys, "db.key")
	rs.mustKiln(t, "build", r, "-o", disk, "--secure-boot-key", dbKey)

	sealed, err := seal.Verify(context.Background(), disk, seal.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	imageRoot := sealed.Seal.Image.Verity.RootHash
	insp, err := builder.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	usrRoot := insp.Contents.OSSlots.RootHash
	fs, espPart := espOfDisk(t, disk)
	dbCert := filepath.Join(keys, "db.crt")
	tmp := t.TempDir()

	t.Run("signed unified kernel images replace the entries", func(t *testing.T) {
		for _, c := range []struct {
			path, title string
			firstBoot   bool
		}{
			{"EFI/Linux/kiln-1.0.efi", "kiln test A/B base", false},
			{"EFI/Linux/ignition-firstboot.efi", "kiln test A/B base (Ignition first boot)", true},
		} {
			local := filepath.Join(tmp, filepath.Base(c.path))
			if err := fs.CopyOut(c.path, local); err != nil {
				t.Fatal(err)
			}
			run(t, "sbverify", "--cert", dbCert, local)
			if err := uki.Verify(context.Background(), local, filepath.Join(other, "db.crt")); err == nil {
				t.Errorf("%s verifies against another factory's db", c.path)
			}
			s, err := uki.Read(local)
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := s.Param("usrhash"); v != usrRoot {
				t.Errorf("%s: usrhash=%q, want the slot's %s", c.path, v, usrRoot)
			}
			if v, _ := s.Param(contract.ImagesRootHashParam); v != imageRoot {
				t.Errorf("%s: %s=%q, want the image partition's %s", c.path, contract.ImagesRootHashParam, v, imageRoot)
			}
			if _, ok := s.Param("ignition.firstboot"); ok != c.firstBoot {
				t.Errorf("%s: ignition.firstboot on its command line: %v, want %v (%q)", c.path, ok, c.firstBoot, s.Cmdline)
			}
			if !bytes.Contains(s.OSRelease, []byte(`PRETTY_NAME="`+c.title+`"`)) {
				t.Errorf("%s: os-release %q lacks its entry's title %q", c.path, s.OSRelease, c.title)
			}
		}
		names, err := fs.List("loader/entries")
		if err != nil {
			t.Fatal(err)
		}
		if len(names) != 0 {
			t.Errorf("loader/entries still holds %v: an unsigned way to boot", names)
		}
		for _, p := range []string{"kiln/1.0/vmlinuz", "kiln/1.0/initrd.img"} {
			if ok, err := fs.Exists(p); err != nil || ok {
				t.Errorf("%s is still on the ESP (%v)", p, err)
			}
		}
	})

	t.Run("systemd-boot is signed, loader.conf enrols the keys", func(t *testing.T) {
		for _, p := range []string{"EFI/systemd/systemd-bootx64.efi", "EFI/BOOT/BOOTX64.EFI"} {
			local := filepath.Join(tmp, filepath.Base(p))
			if err := fs.CopyOut(p, local); err != nil {
				t.Fatal(err)
			}
			run(t, "sbverify", "--cert", dbCert, local)
		}
		checkEnrolment(t, fs, keys)
	})

	t.Run("the ESP and the GPT are sound", func(t *testing.T) {
		f, err := os.Open(disk)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		img := filepath.Join(tmp, "esp.img")
		out, _ := os.Create(img)
		if _, err := io.Copy(out, io.NewSectionReader(f, espPart.Offset, espPart.Size)); err != nil {
			t.Fatal(err)
		}
		out.Close()
		run(t, "fsck.vfat", "-n", img)
		if out := run(t, "sgdisk", "-v", disk); !strings.Contains(out, "No problems found") {
			t.Errorf("sgdisk -v:\n%s", out)
		}
	})

	t.Run("verify and inspect", func(t *testing.T) {
		out := rs.mustKiln(t, "verify", disk)
		if !strings.Contains(out, "2 unified kernel images and 2 systemd-boot binaries signed for db \"sb Secure Boot db\"") {
			t.Errorf("verify does not say it checked the signed boot files:\n%s", out)
		}
		out = rs.mustKiln(t, "inspect", disk)
		if !strings.Contains(out, "Secure Boot: ready (db \"sb Secure Boot db\", 2 unified kernel images") {
			t.Errorf("inspect does not say the disk is Secure Boot-ready:\n%s", out)
		}
	})

	// Each change on a copy of the disk; verify names the file.
	for _, c := range []struct {
		name, file, want string
		change           func(t *testing.T, fs esp.FS, local string)
	}{
		{"a byte changed in a unified kernel image", "EFI/Linux/kiln-1.0.efi", "signature does not verify", func(t *testing.T, fs esp.FS, local string) {
			b, _ := os.ReadFile(local)
			b[len(b)/2] ^= 0x01
			os.WriteFile(local, b, 0o644)
		}},
		{"a unified kernel image re-signed with another factory's db", "EFI/Linux/ignition-firstboot.efi", "signature does not verify", func(t *testing.T, fs esp.FS, local string) {
			run(t, "sbattach", "--remove", local)
			if err := uki.Sign(context.Background(), local, local, filepath.Join(other, "db.key"), filepath.Join(other, "db.crt")); err != nil {
				t.Fatal(err)
			}
		}},
		{"a unified kernel image signed with the factory's db for another image partition", "EFI/Linux/kiln-1.0.efi", "names image partition root hash 00000000", func(t *testing.T, fs esp.FS, local string) {
			s, err := uki.Read(local)
			if err != nil {
				t.Fatal(err)
			}
			kernel := filepath.Join(t.TempDir(), "vmlinuz")
			os.WriteFile(kernel, osOf("1.0").Kernel, 0o644)
			in := uki.Inputs{Kernel: kernel, OSRelease: s.OSRelease,
				Cmdline: strings.Replace(s.Cmdline, imageRoot, strings.Repeat("0", 64), 1)}
			if err := uki.Build(context.Background(), local, in); err != nil {
				t.Fatal(err)
			}
			if err := uki.Sign(context.Background(), local, local, dbKey, dbCert); err != nil {
				t.Fatal(err)
			}
		}},
		{"systemd-boot swapped for an unsigned one", "EFI/BOOT/BOOTX64.EFI", "not signed", func(t *testing.T, fs esp.FS, local string) {
			b, _ := os.ReadFile(uki.SystemdBoot)
			os.WriteFile(local, b, 0o644)
		}},
	} {
		t.Run("verify fails naming the file: "+c.name, func(t *testing.T) {
			d := filepath.Join(t.TempDir(), "disk.raw")
			cloneFile(t, disk, d)
			fs, _ := espOfDisk(t, d)
			local := filepath.Join(t.TempDir(), "file.efi")
			if err := fs.CopyOut(c.file, local); err != nil {
				t.Fatal(err)
			}
			c.change(t, fs, local)
			if err := fs.CopyIn(local, c.file); err != nil {
				t.Fatal(err)
			}
			out, code := rs.kiln(t, "verify", d)
			if code == 0 || !strings.Contains(out, "ESP file "+c.file+": ") || !strings.Contains(out, c.want) {
				t.Errorf("verify of a disk with %s: exit %d, want a failure naming %s (%q):\n%s", c.name, code, c.file, c.want, out)
			}
		})
	}

	// Refusals: nothing is written.
	noKEK := filepath.Join(rs.dir, "sb-no-kek")
	run(t, "cp", "-r", keys, noKEK)
	os.Remove(filepath.Join(noKEK, "KEK.auth"))
	for _, c := range []struct {
		name, base, section, key string
		want                     []string
	}{
		{"another factory's db key", "ab-sb.raw", section, filepath.Join(other, "db.key"), []string{"appliance.yaml:", "does not match the recipe's db certificate", "sb/db.crt"}},
		{"no --secure-boot-key", "ab-sb.raw", section, "", []string{"appliance.yaml:", "--secure-boot-key", "sb/db.key"}},
		{"a missing .auth", "ab-sb.raw", "secureBoot:\n  keys: ../sb-no-kek\n", dbKey, []string{"appliance.yaml:", "secureBoot.keys", "KEK.auth"}},
		{"a base without slots", "base.raw", section, dbKey, []string{"appliance.yaml:", "has no A/B OS slots"}},
		{"a base without systemd-boot", "ab-plain.raw", section, dbKey, []string{"appliance.yaml:", "no systemd-boot on its ESP"}},
	} {
		t.Run("refused: "+c.name, func(t *testing.T) {
			r := rs.recipeOn(t, c.base, "acme", "1.0.0", c.section)
			out := filepath.Join(rs.dir, "refused.raw")
			args := []string{"build", r, "-o", out}
			if c.key != "" {
				args = append(args, "--secure-boot-key", c.key)
			}
			msg, code := rs.kiln(t, args...)
			if code == 0 {
				t.Fatalf("built:\n%s", msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%s was written", out)
			}
			if m, _ := filepath.Glob(filepath.Join(rs.dir, ".refused.raw*")); len(m) > 0 {
				t.Errorf("left behind: %v", m)
			}
		})
	}
}
