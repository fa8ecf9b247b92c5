package bundlefmt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// ReadTrustDir is the one reader of a node's trusted keys (the import
// checks a bundle against them, the release state machine records them as
// the factory release's): every regular *.pub file, as written; a symlink,
// a directory and other names are not keys; a damaged key is an error that
// names its file.
func TestReadTrustDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "trust")
	if keys, err := ReadTrustDir(dir); err != nil || len(keys) != 0 {
		t.Fatalf("ReadTrustDir of a missing directory: %v, %v; want none", keys, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "sub.pub"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, pub, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "other.pub")
	for path, data := range map[string][]byte{
		filepath.Join(dir, contract.TrustFileName(pub)): pub,
		filepath.Join(dir, "README"):                    []byte("not a key"),
		elsewhere:                                       other,
	} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(elsewhere, filepath.Join(dir, "link.pub")); err != nil {
		t.Fatal(err)
	}
	keys, err := ReadTrustDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0].PublicKey != string(pub) || !strings.HasPrefix(keys[0].KeyID, "SHA256:") || keys[0].FileName() != contract.TrustFileName(pub) {
		t.Errorf("ReadTrustDir: %+v; want the one regular key file, as written", keys)
	}
	bad := filepath.Join(dir, "bad.pub")
	if err := os.WriteFile(bad, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTrustDir(dir); err == nil || !strings.Contains(err.Error(), "trusted key "+bad+": not a PEM key file") {
		t.Errorf("ReadTrustDir with a damaged key: %v", err)
	}
}
