package uki

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/pe"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/internal/secureboot"
	"github.com/sassoftware/relic/v8/lib/authenticode"
)

func readCert(t testing.TB, p string) *x509.Certificate {
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

// variant writes a copy of src, changed by change, into dir as name.
func variant(t *testing.T, dir, src, name string, change func(b []byte) []byte) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, change(bytes.Clone(b)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func flipAt(off int64) func([]byte) []byte {
	return func(b []byte) []byte { b[off] ^= 0x01; return b }
}

// peLayout is where the parts Authenticode hashes, and the signature
// table it leaves out, lie in a signed file.
type peLayout struct {
	peStart, optStart  int64 // the "PE\0\0" signature; the optional header
	sections           []*pe.Section
	sectionsEnd        int64 // the end of the last section's raw data
	certStart, certEnd int64 // the certificate table
}

func layout(t *testing.T, p string) peLayout {
	t.Helper()
	f, err := pe.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	l := peLayout{sections: f.Sections}
	l.peStart = int64(b[0x3c]) | int64(b[0x3d])<<8 | int64(b[0x3e])<<16 | int64(b[0x3f])<<24
	l.optStart = l.peStart + 4 + 20
	for _, s := range f.Sections {
		l.sectionsEnd = max(l.sectionsEnd, int64(s.Offset)+int64(s.Size))
	}
	d := f.OptionalHeader.(*pe.OptionalHeader64).DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY]
	l.certStart, l.certEnd = int64(d.VirtualAddress), int64(d.VirtualAddress)+int64(d.Size)
	return l
}

// issueSigner writes a signing key and certificate issued by the db key
// in dir: a db that is a CA for the keys that sign, as some vendors run
// theirs.
func issueSigner(t *testing.T, dir string) (key, cert string) {
	t.Helper()
	dbKeyPEM, err := os.ReadFile(secureboot.Key(dir, secureboot.DB))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(dbKeyPEM)
	parentKey, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	parent := readCert(t, secureboot.Cert(dir, secureboot.DB))
	leafKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "acme signing key"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, leafKey.Public(), parentKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	key, cert = filepath.Join(out, "signer.key"), filepath.Join(out, "signer.crt")
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return key, cert
}

// TestCheckSignature runs CheckSignature and sbverify on each file and
// requires the same verdict of both, and the error CheckSignature owes.
func TestCheckSignature(t *testing.T) {
	ctx := context.Background()
	dbk, dbc := dbKey(keys.db)
	otherK, otherC := dbKey(keys.other)
	kekC := secureboot.Cert(keys.db, secureboot.KEK)
	dir := t.TempDir()
	sign := func(in, name, key, cert string) string {
		out := filepath.Join(dir, name)
		if err := Sign(ctx, in, out, key, cert); err != nil {
			t.Fatal(err)
		}
		return out
	}
	uki := build(t).path
	signed := sign(uki, "signed.efi", dbk, dbc)
	twice := sign(signed, "twice.efi", otherK, otherC)
	boot := sign(SystemdBoot, "systemd-boot.efi", dbk, dbc)
	signerK, signerC := issueSigner(t, keys.db)
	chained := sign(uki, "chained.efi", signerK, signerC)
	l := layout(t, signed)

	type check struct {
		name, file, cert string
		want             error // nil: the signature holds
	}
	checks := []check{
		{"UKI signed by db", signed, dbc, nil},
		{"systemd-boot signed by db", boot, dbc, nil},
		{"UKI signed by another db", signed, otherC, ErrBadSignature},
		{"systemd-boot signed by another db", boot, otherC, ErrBadSignature},
		{"UKI signed by db, checked against KEK", signed, kekC, ErrBadSignature},
		{"unsigned UKI", uki, dbc, ErrUnsigned},
		{"unsigned systemd-boot", SystemdBoot, dbc, ErrUnsigned},
		{"signed twice, the first db", twice, dbc, nil},
		{"signed twice, the second db", twice, otherC, nil},
		{"signed twice, neither db", twice, kekC, ErrBadSignature},
		{"signed by a key db issued", chained, dbc, nil},
		{"signed by a key another db issued", chained, otherC, ErrBadSignature},
		{"not an EFI program", variant(t, dir, "/etc/os-release", "os-release", func(b []byte) []byte { return b }), dbc, ErrUnsigned},
		{"empty file", variant(t, dir, signed, "empty.efi", func([]byte) []byte { return nil }), dbc, ErrUnsigned},
		{"cut in the signature table", variant(t, dir, signed, "cut-sig.efi", func(b []byte) []byte { return b[:len(b)-100] }), dbc, ErrBadSignature},
		{"cut in the kernel", variant(t, dir, signed, "cut-half.efi", func(b []byte) []byte { return b[:len(b)/2] }), dbc, ErrBadSignature},
		{"appended to after signing", variant(t, dir, signed, "appended.efi", func(b []byte) []byte { return append(b, "init=/bin/sh"...) }), dbc, ErrBadSignature},
	}

	// One byte flipped in each section, at a place drawn anew each run
	// (the seed is logged), and in the data after them.
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := mrand.New(mrand.NewPCG(seed, seed))
	for _, s := range l.sections {
		off := int64(s.Offset) + r.Int64N(int64(s.Size))
		checks = append(checks, check{fmt.Sprintf("section %s flipped at %#x", s.Name, off),
			variant(t, dir, signed, "flip"+s.Name+".efi", flipAt(off)), dbc, ErrBadSignature})
	}
	if l.certStart > l.sectionsEnd { // Debian's stub keeps a symbol table after its sections
		off := l.sectionsEnd + r.Int64N(l.certStart-l.sectionsEnd)
		checks = append(checks, check{fmt.Sprintf("data after the sections flipped at %#x", off),
			variant(t, dir, signed, "flip-trailer.efi", flipAt(off)), dbc, ErrBadSignature})
	}

	// The headers: everything is hashed but the checksum and the
	// certificate table's entry, which says where the signature is.
	sectionTable := l.optStart + int64(240) // PE32+ optional header with 16 data directories
	for _, h := range []struct {
		name string
		off  int64
		want error
	}{
		{"DOS header", 0x02, ErrBadSignature},
		{"DOS stub", 0x40, ErrBadSignature},
		{"machine type", l.peStart + 4, ErrBadSignature},
		{"time stamp", l.peStart + 4 + 4, ErrBadSignature},
		{"entry point", l.optStart + 16, ErrBadSignature},
		{"subsystem", l.optStart + 68, ErrBadSignature},
		{"checksum (left out of the hash)", l.optStart + 64, nil},
		{"certificate table's size", l.optStart + 144 + 4, ErrBadSignature},
		{"a section's name", sectionTable + 40*int64(len(l.sections)-1) + 1, ErrBadSignature},
		{"a section's file offset", sectionTable + 40*int64(len(l.sections)-1) + 20, ErrBadSignature},
	} {
		checks = append(checks, check{"header: " + h.name, variant(t, dir, signed, fmt.Sprintf("flip-header-%#x.efi", h.off), flipAt(h.off)), dbc, h.want})
	}

	// The signature: the WIN_CERTIFICATE header, then PKCS#7 SignedData
	// whose last bytes are the RSA signature.
	b, err := os.ReadFile(signed)
	if err != nil {
		t.Fatal(err)
	}
	der := b[l.certStart+8 : l.certEnd]
	derLen := int64(der[2])<<8 | int64(der[3]) + 4 // a SEQUENCE with a two-byte length
	db := readCert(t, dbc)
	find := func(what []byte, plus int) int64 {
		i := bytes.Index(der, what)
		if i < 0 {
			t.Fatalf("%x is not in the signature", what)
		}
		return int64(i + plus)
	}
	for _, s := range []struct {
		name string
		at   int64 // in the PKCS#7 DER
	}{
		{"SignedData's length", 3},
		{"the image digest in SpcIndirectData", find(sha256Imprint(t, signed), 5)},
		{"the signer's certificate", find(db.Raw, len(db.Raw)/2)},
		{"the signer's certificate's serial number", find(db.SerialNumber.Bytes(), 2)},
		{"the signed attributes", derLen - 256 - 60},
		{"the RSA signature", derLen - 1},
		{"the RSA signature's first byte", derLen - 256},
	} {
		checks = append(checks, check{"signature: " + s.name, variant(t, dir, signed, fmt.Sprintf("flip-sig-%d.efi", s.at), flipAt(l.certStart+8+s.at)), dbc, ErrBadSignature})
	}

	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			err := CheckSignature(c.file, readCert(t, c.cert))
			sbverifyOK := exec.Command("sbverify", "--cert", c.cert, c.file).Run() == nil
			if (err == nil) != sbverifyOK {
				t.Errorf("CheckSignature: %v; sbverify's verdict: ok %v", err, sbverifyOK)
			}
			switch {
			case c.want == nil:
				if err != nil {
					t.Fatalf("CheckSignature: %v", err)
				}
			case err == nil:
				t.Fatalf("CheckSignature: ok, want %v", c.want)
			case !strings.HasPrefix(err.Error(), c.file+": "):
				t.Fatalf("CheckSignature: %v, want it to name %s", err, c.file)
			case !errors.Is(err, c.want):
				t.Fatalf("CheckSignature: %v, want %v", err, c.want)
			default:
				t.Log(err)
			}
		})
	}
}

// sha256Imprint is the image's Authenticode digest, which the signature
// carries: found by it, a byte of it is flipped.
func sha256Imprint(t *testing.T, file string) []byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := authenticode.DigestPE(f, crypto.SHA256, false)
	if err != nil {
		t.Fatal(err)
	}
	return d.Imprint
}

func TestCheckSignatureRefuses(t *testing.T) {
	_, dbc := dbKey(keys.db)
	if err := CheckSignature(filepath.Join(t.TempDir(), "missing.efi"), readCert(t, dbc)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if err := CheckSignature(SystemdBoot, nil); err == nil || !strings.Contains(err.Error(), "no db certificate") {
		t.Errorf("no certificate: %v", err)
	}
}

// BenchmarkCheckSignature checks a signed 40 MiB UKI (a 30 MiB kernel, a
// 10 MiB initramfs) with CheckSignature and with sbverify, the factory's
// tool, as a subprocess, as Verify runs it.
func BenchmarkCheckSignature(b *testing.B) {
	dir := b.TempDir()
	r := mrand.New(mrand.NewPCG(1, 2))
	write := func(name string, n int) string {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			b.Fatal(err)
		}
		return p
	}
	kernel, initrd := write("vmlinuz", 30<<20), write("initrd", 10<<20)
	uki := filepath.Join(dir, "uki.efi")
	ctx := context.Background()
	if err := Build(ctx, uki, Inputs{Kernel: kernel, Initrds: []string{initrd}, Cmdline: testCmdline, OSRelease: []byte(testOSRel)}); err != nil {
		b.Fatal(err)
	}
	key, cert := dbKey(keys.db)
	if err := Sign(ctx, uki, uki, key, cert); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(uki)
	if err != nil {
		b.Fatal(err)
	}
	db := readCert(b, cert)
	b.Run("kiln", func(b *testing.B) {
		b.SetBytes(fi.Size())
		b.ReportAllocs() // streamed: far fewer bytes than the file's
		for b.Loop() {
			if err := CheckSignature(uki, db); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sbverify", func(b *testing.B) {
		b.SetBytes(fi.Size())
		for b.Loop() {
			if out, err := exec.Command("sbverify", "--cert", cert, uki).CombinedOutput(); err != nil {
				b.Fatalf("sbverify: %v\n%s", err, out)
			}
		}
	})
}
