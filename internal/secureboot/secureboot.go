// Package secureboot makes a factory's Secure Boot keys: the platform key
// (PK), the key exchange key (KEK) and the signature database key (db),
// each an RSA private key with its certificate, and the signed EFI
// signature lists systemd-boot enrols from loader/keys/NAME/ on a machine
// in setup mode. The X.509 work is Go; the signature lists and their
// signatures are efitools', the ecosystem's standard steps.
package secureboot

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/hosttools"
)

// The three keys, from the top of the hierarchy: PK signs updates of PK
// and KEK, KEK signs updates of db, and db signs what the firmware boots.
const (
	PK  = "PK"
	KEK = "KEK"
	DB  = "db"
)

// Names lists the keys in the order Generate makes them.
var Names = []string{PK, KEK, DB}

// OwnerGUID is the signature owner kiln writes into every EFI signature
// list. The firmware only records it (it tells whose entry a list is);
// one fixed value, so that the lists of every kiln factory are told
// apart from the vendors' and a later update can find kiln's entries.
const OwnerGUID = "7b4c1b6a-3f2e-4c1d-9a55-6b696c6e0001"

// Validity is how long the certificates are valid. Firmware ignores a
// certificate's dates (it has no trusted clock), so the dates only matter
// to tools that check them at the factory, sbverify and kiln verify; they
// outlive an appliance's field life, since replacing db on machines in the
// field needs the KEK holder and every appliance visited.
const Validity = 20 * 365 * 24 * time.Hour

// Tools are the host tools Generate runs.
var Tools = []string{"cert-to-efi-sig-list", "sign-efi-sig-list"}

// Key, Cert and Auth name a key's files inside the directory: the private
// key (PKCS#8 PEM, 0600: it stays at the factory), the certificate (PEM)
// and the signed signature list systemd-boot enrols.
func Key(dir, name string) string  { return filepath.Join(dir, name+".key") }
func Cert(dir, name string) string { return filepath.Join(dir, name+".crt") }
func Auth(dir, name string) string { return filepath.Join(dir, name+".auth") }

// Files lists what Generate writes into its directory, by base name.
func Files() []string {
	var fs []string
	for _, n := range Names {
		fs = append(fs, n+".key", n+".crt", n+".auth")
	}
	return fs
}

// signer of each key's signature list: PK signs its own and KEK's (the
// firmware accepts a PK or KEK update signed by PK), KEK signs db's.
var signer = map[string]string{PK: PK, KEK: PK, DB: KEK}

// Generate writes a new directory dir with the three keys, their
// certificates and signed signature lists (Files). It refuses a dir that
// exists, as kiln never overwrites a key, and builds everything in a
// temporary directory beside it that it renames only once complete:
// nothing half-written is left on failure.
func Generate(ctx context.Context, dir string) error {
	if err := hosttools.Check(Tools...); err != nil {
		return err
	}
	if _, err := os.Lstat(dir); err == nil {
		return fmt.Errorf("%s exists: kiln never overwrites keys; choose another directory or move it away", dir)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	dir = filepath.Clean(dir)
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: directory %s does not exist: make it first", dir, filepath.Dir(dir))
	} else if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	cn := filepath.Base(dir)
	now := time.Now()
	for _, name := range Names {
		if err := writeKeyPair(tmp, name, fmt.Sprintf("%s Secure Boot %s", cn, name), now); err != nil {
			return err
		}
	}
	for _, name := range Names {
		if err := writeAuth(ctx, tmp, name); err != nil {
			return err
		}
	}
	for _, f := range Files() {
		if err := syncFile(filepath.Join(tmp, f)); err != nil {
			return err
		}
	}
	// RENAME_NOREPLACE: a directory made meanwhile at dir (rename(2) would
	// replace an empty one) is refused, not replaced.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%s exists: kiln never overwrites keys; choose another directory or move it away", dir)
		}
		return fmt.Errorf("rename %s to %s: %w", tmp, dir, err)
	}
	return syncFile(filepath.Dir(dir))
}

// writeKeyPair writes NAME.key and a self-signed NAME.crt. Each
// certificate is self-signed, as sbctl and the efitools tutorials make
// them, rather than KEK issued by PK and db by KEK: the firmware takes
// every entry of PK, KEK and db as a trust anchor of its own and never
// walks an X.509 chain between them; the hierarchy is who signs each
// variable's update (the .auth files), not who issued the certificate.
// Self-signed, each certificate also verifies alone (sbverify --cert).
func writeKeyPair(dir, name, cn string, now time.Time) error {
	// RSA 2048: what OVMF and other firmware and sbsign take.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour), // a factory clock a little behind
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true, // as `openssl req -x509` makes them
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", name, err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(Key(dir, name), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(Cert(dir, name), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeAuth writes NAME.auth: NAME's certificate as an EFI signature list
// (owner OwnerGUID), signed for the NAME variable by its signer's key.
func writeAuth(ctx context.Context, dir, name string) error {
	esl := filepath.Join(dir, name+".esl")
	defer os.Remove(esl)
	out, err := exec.CommandContext(ctx, "cert-to-efi-sig-list", "-g", OwnerGUID, Cert(dir, name), esl).CombinedOutput()
	if err != nil {
		return hosttools.RunError("cert-to-efi-sig-list "+name+".crt", err, out)
	}
	s := signer[name]
	out, err = exec.CommandContext(ctx, "sign-efi-sig-list", "-g", OwnerGUID, "-k", Key(dir, s), "-c", Cert(dir, s),
		name, esl, Auth(dir, name)).CombinedOutput()
	if err != nil {
		return hosttools.RunError(fmt.Sprintf("sign-efi-sig-list %s with %s.key", name, s), err, out)
	}
	return os.Chmod(Auth(dir, name), 0o644) // public, like the certificate (efitools writes 0600)
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
