package secureboot

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/internal/hosttools"
)

func generate(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "acme-sb")
	if err := Generate(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readCert(t *testing.T, dir, name string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(Cert(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		t.Fatalf("%s.crt is not a PEM certificate", name)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGenerate(t *testing.T) {
	dir := generate(t)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	want := slices.Clone(Files())
	slices.Sort(want)
	if !slices.Equal(got, want) { // no .esl left behind
		t.Errorf("%s holds %v, want %v", dir, got, want)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".*")); len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
	serials := map[string]bool{}
	for _, name := range Names {
		t.Run(name, func(t *testing.T) {
			for file, mode := range map[string]os.FileMode{Key(dir, name): 0o600, Cert(dir, name): 0o644, Auth(dir, name): 0o644} {
				fi, err := os.Stat(file)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != mode {
					t.Errorf("%s: mode %v, want %v", file, fi.Mode().Perm(), mode)
				}
			}
			c := readCert(t, dir, name)
			if want := "acme-sb Secure Boot " + name; c.Subject.CommonName != want {
				t.Errorf("CN %q, want %q", c.Subject.CommonName, want)
			}
			if err := c.CheckSignatureFrom(c); err != nil {
				t.Errorf("not self-signed: %v", err)
			}
			pub, ok := c.PublicKey.(*rsa.PublicKey)
			if !ok || pub.N.BitLen() != 2048 {
				t.Errorf("public key %T, want RSA 2048", c.PublicKey)
			}
			if life := c.NotAfter.Sub(time.Now()); life < Validity-2*time.Hour {
				t.Errorf("valid for %v more, want %v", life, Validity)
			}
			if serials[c.SerialNumber.String()] {
				t.Error("serial number shared with another key")
			}
			serials[c.SerialNumber.String()] = true
			b, err := os.ReadFile(Key(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			blk, _ := pem.Decode(b)
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if !k.(*rsa.PrivateKey).PublicKey.Equal(pub) {
				t.Error("the key is not the certificate's")
			}
		})
	}
}

// auth is an EFI_VARIABLE_AUTHENTICATION_2 file cut into its parts: the
// timestamp as sign-efi-sig-list -t takes it, the PKCS#7 SignedData and
// the EFI signature list that follows.
type auth struct {
	timestamp       string
	signedData, esl []byte
}

func parseAuth(t *testing.T, b []byte) auth {
	t.Helper()
	if len(b) < 40 {
		t.Fatalf("auth file of %d bytes", len(b))
	}
	// EFI_TIME: year (u16), month, day, hour, minute, second (u8 each), ...
	ts := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d", binary.LittleEndian.Uint16(b), b[2], b[3], b[4], b[5], b[6])
	// WIN_CERTIFICATE_UEFI_GUID: dwLength (u32, the whole), revision,
	// type, the cert type GUID (24 bytes in all), then the SignedData.
	n := int(binary.LittleEndian.Uint32(b[16:]))
	if 16+n > len(b) || n < 24 {
		t.Fatalf("auth file: certificate length %d of %d bytes", n, len(b))
	}
	return auth{timestamp: ts, signedData: b[16+24 : 16+n], esl: b[16+n:]}
}

// guidBytes is a GUID as EFI stores it: the first three groups little-endian.
func guidBytes(t *testing.T, s string) []byte {
	t.Helper()
	var a uint32
	var b, c uint16
	var d [8]byte
	if _, err := fmt.Sscanf(strings.ReplaceAll(s, "-", ""), "%08x%04x%04x%02x%02x%02x%02x%02x%02x%02x%02x",
		&a, &b, &c, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &d[6], &d[7]); err != nil {
		t.Fatal(err)
	}
	out := binary.LittleEndian.AppendUint32(nil, a)
	out = binary.LittleEndian.AppendUint16(out, b)
	out = binary.LittleEndian.AppendUint16(out, c)
	return append(out, d[:]...)
}

// Each .auth holds its own certificate (efitools reads it back to the same
// one, owned by OwnerGUID) and a signature over exactly what efitools
// signs for that variable, which the signer's certificate verifies and
// the other keys' do not.
func TestAuthFiles(t *testing.T) {
	dir := generate(t)
	for _, tt := range []struct {
		name, signer string
		others       []string
	}{
		{name: PK, signer: PK, others: []string{KEK, DB}},
		{name: KEK, signer: PK, others: []string{KEK, DB}},
		{name: DB, signer: KEK, others: []string{PK, DB}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			work := t.TempDir()
			b, err := os.ReadFile(Auth(dir, tt.name))
			if err != nil {
				t.Fatal(err)
			}
			a := parseAuth(t, b)

			esl := filepath.Join(work, "list.esl")
			if err := os.WriteFile(esl, a.esl, 0o644); err != nil {
				t.Fatal(err)
			}
			run(t, "sig-list-to-certs", esl, filepath.Join(work, "cert"))
			der, err := os.ReadFile(filepath.Join(work, "cert-0.der"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(der, readCert(t, dir, tt.name).Raw) {
				t.Errorf("the list's certificate is not %s.crt", tt.name)
			}
			if _, err := os.Stat(filepath.Join(work, "cert-1.der")); err == nil {
				t.Error("the list holds more than one certificate")
			}
			// EFI_SIGNATURE_LIST header (28 bytes), then the owner GUID.
			if owner := a.esl[28 : 28+16]; !bytes.Equal(owner, guidBytes(t, OwnerGUID)) {
				t.Errorf("owner %x, want %s", owner, OwnerGUID)
			}

			tbs := filepath.Join(work, "tbs")
			run(t, "sign-efi-sig-list", "-o", "-t", a.timestamp, "-g", OwnerGUID, tt.name, esl, tbs)
			p7 := filepath.Join(work, "p7.der")
			if err := os.WriteFile(p7, contentInfo(t, a.signedData), 0o644); err != nil {
				t.Fatal(err)
			}
			verify := func(ca string) error {
				out, err := exec.Command("openssl", "smime", "-verify", "-inform", "DER", "-in", p7, "-binary",
					"-content", tbs, "-CAfile", Cert(dir, ca), "-purpose", "any", "-out", os.DevNull).CombinedOutput()
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				return nil
			}
			if err := verify(tt.signer); err != nil {
				t.Errorf("%s.auth is not signed by %s: %v", tt.name, tt.signer, err)
			}
			for _, o := range tt.others {
				if verify(o) == nil {
					t.Errorf("%s.auth verifies with %s.crt too", tt.name, o)
				}
			}
		})
	}
}

// contentInfo wraps a bare PKCS#7 SignedData (as UEFI carries it) in the
// ContentInfo openssl reads.
func contentInfo(t *testing.T, signedData []byte) []byte {
	t.Helper()
	b, err := asn1.Marshal(struct {
		Type    asn1.ObjectIdentifier
		Content asn1.RawValue
	}{
		Type:    asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 2},
		Content: asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: signedData},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// Refused or failed, Generate leaves nothing: not at dir, not beside it.
func TestGenerateLeavesNothing(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		name     string
		ctx      context.Context
		existing bool   // dir is there, empty
		sub      string // between the test's directory and sb
		path     string
		want     string
	}{
		{name: "dir exists", ctx: context.Background(), existing: true, want: "exists: kiln never overwrites keys"},
		{name: "parent missing", ctx: context.Background(), sub: "nosuch/", want: "nosuch does not exist: make it first"},
		{name: "efitools missing", ctx: context.Background(), path: t.TempDir(), want: "apt-get install efitools"},
		{name: "canceled mid-way", ctx: canceled, want: "cert-to-efi-sig-list PK.crt"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, tt.sub, "sb")
			if tt.existing {
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tt.path != "" {
				t.Setenv("PATH", tt.path)
			}
			err := Generate(tt.ctx, dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Generate: %v, want an error saying %q", err, tt.want)
			}
			if tt.path != "" {
				var me *hosttools.MissingError
				if !errors.As(err, &me) || len(me.Missing) != 2 {
					t.Errorf("Generate: %v, want both efitools programs named", err)
				}
			}
			ents, _ := os.ReadDir(parent)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if want := map[bool]int{true: 1, false: 0}[tt.existing]; len(names) != want {
				t.Errorf("left %v", names)
			}
			if tt.existing {
				if ents, _ := os.ReadDir(dir); len(ents) > 0 {
					t.Errorf("wrote into the existing %s", dir)
				}
			}
		})
	}
}
