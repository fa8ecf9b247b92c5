//go:build !nodeonly

package main

// Black-box tests of a reflash stick of a recipe with secureBoot: its ESP
// read back with the real tools (sbverify, mtools) and kiln's own
// signature check, as TestBuildSecureBoot reads a disk's.

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func TestReflashStickSecureBoot(t *testing.T) {
	rs := newReleases(t)
	base := filepath.Join(rs.dir, "ab-sb.raw")
	sbBase(t, base)
	keys, other := filepath.Join(rs.dir, "sb"), filepath.Join(rs.dir, "other-sb")
	rs.mustKiln(t, "key", "secureboot", keys)
	rs.mustKiln(t, "key", "secureboot", other)
	r := rs.recipeOn(t, "ab-sb.raw", "acme", "1.0.0", "secureBoot:\n  keys: ../sb\n")
	dbKey, dbCert := filepath.Join(keys, "db.key"), filepath.Join(keys, "db.crt")
	db := parseCert(t, dbCert)
	insp, err := builder.Inspect(base)
	if err != nil || insp.OSSlots == nil {
		t.Fatalf("the base's slots: %v", err)
	}
	usrRoot := insp.OSSlots.RootHash

	// checkStick checks the stick's ESP holds only signed boot files.
	checkStick := func(t *testing.T, stick string) {
		t.Helper()
		fs, _ := espOfDisk(t, stick)
		tmp := t.TempDir()
		for _, c := range []struct {
			path      string
			firstBoot bool
		}{
			{"EFI/Linux/kiln-1.0.efi", false},
			{"EFI/Linux/ignition-firstboot.efi", true},
		} {
			local := filepath.Join(tmp, filepath.Base(c.path))
			if err := fs.CopyOut(c.path, local); err != nil {
				t.Fatal(err)
			}
			run(t, "sbverify", "--cert", dbCert, local)
			if err := uki.CheckSignature(local, db); err != nil {
				t.Errorf("%s: %v", c.path, err)
			}
			if err := uki.CheckSignature(local, parseCert(t, filepath.Join(other, "db.crt"))); err == nil {
				t.Errorf("%s verifies against another factory's db", c.path)
			}
			s, err := uki.Read(local)
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := s.Param("usrhash"); v != usrRoot {
				t.Errorf("%s: usrhash=%q, want the base entry's %s", c.path, v, usrRoot)
			}
			if v, ok := s.Param(contract.ImagesRootHashParam); ok {
				t.Errorf("%s: %s=%q on the command line of a stick, whose image partition has no dm-verity", c.path, contract.ImagesRootHashParam, v)
			}
			if _, ok := s.Param("ignition.firstboot"); ok != c.firstBoot {
				t.Errorf("%s: ignition.firstboot on its command line: %v, want %v (%q)", c.path, ok, c.firstBoot, s.Cmdline)
			}
		}
		if names, err := fs.List("EFI/Linux"); err != nil || len(names) != 2 {
			t.Errorf("EFI/Linux holds %v (%v), want the two signed images", names, err)
		}
		if names, err := fs.List("loader/entries"); err != nil || len(names) != 0 {
			t.Errorf("loader/entries holds %v (%v): an unsigned way to boot", names, err)
		}
		for _, p := range []string{"kiln/1.0/vmlinuz", "kiln/1.0/initrd.img"} {
			if ok, err := fs.Exists(p); err != nil || ok {
				t.Errorf("%s is still on the stick's ESP (%v)", p, err)
			}
		}
		for _, p := range []string{"EFI/systemd/systemd-bootx64.efi", "EFI/BOOT/BOOTX64.EFI"} {
			local := filepath.Join(tmp, filepath.Base(p))
			if err := fs.CopyOut(p, local); err != nil {
				t.Fatal(err)
			}
			run(t, "sbverify", "--cert", dbCert, local)
			if err := uki.CheckSignature(local, db); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		checkEnrolment(t, fs, keys)
		if out := rs.mustKiln(t, "verify", stick); !strings.Contains(out, "OK (exactly the bytes kiln reflash-stick wrote)") {
			t.Errorf("kiln verify %s:\n%s", stick, out)
		}
		if out := rs.mustKiln(t, "inspect", stick); !strings.Contains(out, `Secure Boot: ready (db "sb Secure Boot db", 2 unified kernel images, keys to enrol in loader/keys/auto)`) {
			t.Errorf("kiln inspect does not say the stick is Secure Boot-ready:\n%s", out)
		}
	}

	t.Run("built from the recipe", func(t *testing.T) {
		stick := filepath.Join(rs.dir, "stick.raw")
		rs.mustKiln(t, "reflash-stick", r, "-o", stick, "--secure-boot-key", dbKey)
		checkStick(t, stick)
	})

	t.Run("with --disk", func(t *testing.T) {
		disk := filepath.Join(rs.dir, "disk.raw")
		rs.mustKiln(t, "build", r, "-o", disk, "--secure-boot-key", dbKey)
		stick := filepath.Join(rs.dir, "stick-of-disk.raw")
		rs.mustKiln(t, "reflash-stick", r, "--disk", disk, "-o", stick, "--secure-boot-key", dbKey)
		checkStick(t, stick)
	})

	// Refusals, before any long work: nothing written, nothing left.
	plain := rs.recipeOn(t, "ab-sb.raw", "plain", "1.0.0", "")
	// The same appliance built without its secureBoot section.
	unsigned := filepath.Join(rs.dir, "unsigned", filepath.Base(r))
	os.MkdirAll(filepath.Dir(unsigned), 0o755)
	y, _ := os.ReadFile(r)
	os.WriteFile(unsigned, []byte(strings.Replace(string(y), "secureBoot:\n  keys: ../sb\n", "", 1)), 0o644)
	unsignedDisk := filepath.Join(rs.dir, "unsigned.raw")
	rs.mustKiln(t, "build", unsigned, "-o", unsignedDisk)
	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
		// verified: refused once the disk is verified, as kiln verify
		// does (its kiln.json says how it was built), not before.
		verified bool
	}{
		{"no --secure-boot-key", []string{r}, 2, []string{"appliance.yaml:", "Secure Boot reflash stick", "--secure-boot-key", "sb/db.key"}, false},
		{"no --secure-boot-key with --disk", []string{r, "--disk", filepath.Join(rs.dir, "disk.raw")}, 2, []string{"--secure-boot-key", "sb/db.key"}, false},
		{"another factory's db key", []string{r, "--secure-boot-key", filepath.Join(other, "db.key")}, 1, []string{"appliance.yaml:", "does not match the recipe's db certificate", "sb/db.crt"}, false},
		{"a key for a recipe without secureBoot", []string{plain, "--secure-boot-key", dbKey}, 1, []string{"has no secureBoot section", "drop --secure-boot-key"}, false},
		{"a --disk built without Secure Boot", []string{r, "--disk", unsignedDisk, "--secure-boot-key", dbKey}, 1, []string{unsignedDisk + " was built without Secure Boot", "has secureBoot"}, true},
	} {
		t.Run("refused: "+c.name, func(t *testing.T) {
			out := filepath.Join(rs.dir, "refused.raw")
			msg, code := rs.kiln(t, append([]string{"reflash-stick", "-o", out}, c.args...)...)
			if code != c.code {
				t.Errorf("exit %d, want %d:\n%s", code, c.code, msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
			if begun := strings.Contains(msg, "started"); begun != c.verified {
				t.Errorf("work begun before the refusal: %v, want %v:\n%s", begun, c.verified, msg)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%s was written", out)
			}
			if m, _ := filepath.Glob(filepath.Join(rs.dir, ".refused.raw*")); len(m) > 0 {
				t.Errorf("left behind: %v", m)
			}
			assertNoWork(t, rs.dir)
		})
	}
}

func parseCert(t *testing.T, p string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", p)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
