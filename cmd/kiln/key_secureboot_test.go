package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/internal/secureboot"
)

// kiln key secureboot writes the three keys into a new directory, says
// what stays at the factory, and never writes over or into an existing
// one; a bad name is a usage error that writes nothing.
func TestKeySecureBoot(t *testing.T) {
	parent := t.TempDir()
	f := &fixture{dir: parent, cache: filepath.Join(parent, "cache")}
	dir := filepath.Join(parent, "acme-sb")
	out := mustKiln(t, f, "key", "secureboot", dir)
	for _, want := range []string{"wrote " + dir + ": PK.key PK.crt PK.auth KEK.key", "keep them at the factory", dir + "/db.crt verifies"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	want := slices.Clone(secureboot.Files())
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s holds %v, want %v", dir, got, want)
	}
	// The certificates carry DIR's name (what they hold is
	// internal/secureboot's test).
	b, err := os.ReadFile(secureboot.Cert(dir, secureboot.DB))
	if err != nil {
		t.Fatal(err)
	}
	if blk, _ := pem.Decode(b); blk == nil {
		t.Error("db.crt is not PEM")
	} else if c, err := x509.ParseCertificate(blk.Bytes); err != nil {
		t.Error(err)
	} else if c.Subject.CommonName != "acme-sb Secure Boot db" {
		t.Errorf("db.crt: subject %v, want CN acme-sb Secure Boot db", c.Subject)
	}
	before, _ := os.ReadFile(secureboot.Key(dir, secureboot.DB))

	msg, code := kiln(t, f, "key", "secureboot", dir)
	if code != exitFailure || !strings.Contains(msg, "kiln: key secureboot: "+dir+" exists: kiln never overwrites keys") {
		t.Errorf("kiln key secureboot over %s: exit %d:\n%s", dir, code, msg)
	}
	if after, _ := os.ReadFile(secureboot.Key(dir, secureboot.DB)); string(after) != string(before) {
		t.Error("the existing db.key changed")
	}

	for _, bad := range []string{"", parent + "/.hidden"} {
		msg, code := kiln(t, f, "key", "secureboot", bad)
		if code != exitUsage || !strings.Contains(msg, "give a new directory such as secureboot") {
			t.Errorf("kiln key secureboot %q: exit %d, want %d:\n%s", bad, code, exitUsage, msg)
		}
	}
	if msg, code := kiln(t, f, "key", "secureboot"); code != exitUsage || !strings.Contains(msg, "(usage: kiln key secureboot DIR)") {
		t.Errorf("kiln key secureboot: exit %d:\n%s", code, msg)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Errorf("%s holds %v, want acme-sb alone", parent, ents)
	}
}
