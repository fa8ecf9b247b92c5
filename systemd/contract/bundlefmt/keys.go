package bundlefmt

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Key files are PEM: the private key PKCS#8 ("PRIVATE KEY"), the public key
// PKIX ("PUBLIC KEY") — what `openssl genpkey -algorithm ed25519` and
// `openssl pkey -pubout` write, so either tool can make or read them.
const (
	pemPrivate = "PRIVATE KEY"
	pemPublic  = "PUBLIC KEY"
)

// GenerateKey makes a new ed25519 key pair and returns both PEM files.
func GenerateKey() (private, public []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	public, err = EncodePublicKey(pub)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivate, Bytes: der}), public, nil
}

// EncodePublicKey returns pub as a PKIX PEM file.
func EncodePublicKey(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublic, Bytes: der}), nil
}

// ParsePrivateKey reads a PKCS#8 PEM ed25519 private key.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	der, err := onePEM(data, pemPrivate, pemPublic, "this is a public key; signing needs the private key (the .key file)")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key is %T; kiln signs with ed25519 keys only", k)
	}
	return priv, nil
}

// ParsePublicKey reads a PKIX PEM ed25519 public key.
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	der, err := onePEM(data, pemPublic, pemPrivate, "this is a private key; give the public key (the .pub file), never ship the private one")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("public key is %T; kiln verifies ed25519 keys only", k)
	}
	return pub, nil
}

// onePEM returns the bytes of the one PEM block of type want in data; a
// block of type other gets the hint otherMsg.
func onePEM(data []byte, want, other, otherMsg string) ([]byte, error) {
	block, rest := pem.Decode(data)
	switch {
	case block == nil:
		return nil, fmt.Errorf("not a PEM key file (make one with `kiln key generate`)")
	case block.Type == other:
		return nil, errors.New(otherMsg)
	case block.Type != want:
		return nil, fmt.Errorf("PEM block %q: want %q, as `kiln key generate` writes", block.Type, want)
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, fmt.Errorf("more than one PEM block: give a file holding one key")
	}
	return block.Bytes, nil
}

// KeyID names a public key: its SSH SHA256 fingerprint ("SHA256:…"), the
// key ID DSSE's own verifier computes, and what `ssh-keygen -l` prints.
func KeyID(pub ed25519.PublicKey) (string, error) {
	return dsse.SHA256KeyID(pub)
}

// TrustedKey makes the manifest's entry for a public key.
func TrustedKey(pub ed25519.PublicKey) (contract.TrustKey, error) {
	id, err := KeyID(pub)
	if err != nil {
		return contract.TrustKey{}, err
	}
	p, err := EncodePublicKey(pub)
	if err != nil {
		return contract.TrustKey{}, err
	}
	return contract.TrustKey{KeyID: id, PublicKey: string(p)}, nil
}

// maxKeyFile bounds a key file: a PEM ed25519 key is about 100 bytes.
const maxKeyFile = 64 << 10

// ReadTrustDir reads the keys a node accepts bundles from: every regular
// file named *.pub in dir (contract.TrustDir, written by the factory
// through Ignition and by the node's release state machine, one key each,
// named contract.TrustFileName), each as written. A symlink is not read (it
// could name any key on the node). A dir that does not exist holds none.
func ReadTrustDir(dir string) ([]contract.TrustKey, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read trusted keys: %w", err)
	}
	var keys []contract.TrustKey
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".pub") || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		data, err := inputfile.ReadFile(p, maxKeyFile, inputfile.NoFollow())
		if err != nil {
			return nil, fmt.Errorf("read trusted key: %w", err)
		}
		pub, err := ParsePublicKey(data)
		if err != nil {
			return nil, fmt.Errorf("trusted key %s: %w", p, err)
		}
		k, err := TrustedKey(pub)
		if err != nil {
			return nil, err
		}
		k.PublicKey = string(data) // as written: its file name is its hash
		keys = append(keys, k)
	}
	return keys, nil
}
