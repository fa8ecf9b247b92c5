package uki

import (
	"crypto/x509"
	"debug/pe"
	"fmt"
	"os"
	"strings"

	"github.com/sassoftware/relic/v8/lib/authenticode"
	"github.com/sassoftware/relic/v8/lib/pkcs9"
)

// CheckSignature checks that the PE file at path (a unified kernel image,
// or systemd-boot) carries an Authenticode signature by db's key over its
// current bytes, as the firmware checks it under Secure Boot.
//
// It is Verify without sbverify, for the node, which has no sbsigntool:
// relic's authenticode package parses the signatures, checks each one's
// signed attributes and that its digest is the image's Authenticode hash
// (Microsoft's "Windows Authenticode Portable Executable Signature
// Format": the headers without the checksum and the certificate table's
// entry, the sections, the data after them without the certificate
// table), streaming the file. A file signed more than once (sbsign
// appends) passes if any signature is by db, as the firmware takes any.
func CheckSignature(path string, db *x509.Certificate) error {
	if db == nil {
		return fmt.Errorf("check signature of %s: no db certificate given", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("check signature: %w", err)
	}
	defer f.Close()
	if err := checkCertTable(f, path); err != nil {
		return err
	}
	sigs, err := authenticode.VerifyPE(f, false)
	if err != nil {
		return fmt.Errorf("%s: %w: changed after signing, or damaged (%v)", path, ErrBadSignature, err)
	}
	var signers []string
	for _, s := range sigs {
		if signedBy(s.TimestampedSignature, db) {
			return nil
		}
		signers = append(signers, fmt.Sprintf("%q", s.Certificate.Subject.String()))
	}
	return fmt.Errorf("%s: %w against db %q: signed by %s, another key", path, ErrBadSignature, db.Subject.String(), strings.Join(signers, ", "))
}

// checkCertTable reads the PE headers and checks that the file has a
// certificate table (the security data directory) that lies inside it,
// before relic reads the table whole: a header that claims gigabytes
// must not make the node allocate them.
func checkCertTable(f *os.File, path string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("check signature: %w", err)
	}
	var mz [2]byte
	if _, err := f.ReadAt(mz[:], 0); err != nil || string(mz[:]) != "MZ" {
		return fmt.Errorf("%s: %w: it is not an EFI program (no PE header)", path, ErrUnsigned)
	}
	p, err := pe.NewFile(f)
	if err != nil {
		return fmt.Errorf("%s: %w: its PE headers are damaged, or it is cut short (%v)", path, ErrBadSignature, err)
	}
	var dirs []pe.DataDirectory
	switch h := p.OptionalHeader.(type) {
	case *pe.OptionalHeader64:
		dirs = h.DataDirectory[:min(int(h.NumberOfRvaAndSizes), len(h.DataDirectory))]
	case *pe.OptionalHeader32:
		dirs = h.DataDirectory[:min(int(h.NumberOfRvaAndSizes), len(h.DataDirectory))]
	default:
		return fmt.Errorf("%s: %w: it is not an EFI program (no PE optional header)", path, ErrUnsigned)
	}
	if len(dirs) <= pe.IMAGE_DIRECTORY_ENTRY_SECURITY || dirs[pe.IMAGE_DIRECTORY_ENTRY_SECURITY].Size == 0 {
		return fmt.Errorf("%s: %w: Secure Boot firmware refuses to boot it; sign it with the db key", path, ErrUnsigned)
	}
	// The one data directory entry that is a file offset, not an address.
	t := dirs[pe.IMAGE_DIRECTORY_ENTRY_SECURITY]
	if end := int64(t.VirtualAddress) + int64(t.Size); end > fi.Size() {
		return fmt.Errorf("%s: %w: its signature table runs to byte %d, past the file's end (%d bytes): cut short, or damaged", path, ErrBadSignature, end, fi.Size())
	}
	return nil
}

// signedBy tells whether the signature's certificate is db, or is issued
// by db through the intermediates it carries. Dates are not what the
// firmware checks (it has no clock to trust): the chain is checked as of
// the moment the signer's certificate became valid.
func signedBy(sig pkcs9.TimestampedSignature, db *x509.Certificate) bool {
	if sig.Certificate.Equal(db) {
		return true
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(db)
	for _, c := range sig.Intermediates {
		inter.AddCert(c)
	}
	_, err := sig.Certificate.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		CurrentTime: sig.Certificate.NotBefore,
	})
	return err == nil
}
