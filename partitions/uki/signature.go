package uki

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
)

// CheckSignature checks that the EFI program at path is signed by db.
func CheckSignature(path string, db *x509.Certificate) error {
	dir, err := os.MkdirTemp("", "kiln-db-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cert := filepath.Join(dir, "db.crt")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: db.Raw}), 0o600); err != nil {
		return err
	}
	return Verify(context.Background(), path, cert)
}
