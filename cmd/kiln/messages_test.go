//go:build !nodeonly

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotKilnFiles (issue 26, messages): verify and inspect given a file
// that is none of kiln's say what kiln takes and what the file is, instead
// of "no GPT partition table … such as a CoreOS metal image"; a stick cut
// short by one byte is called truncated, by how much, instead of "no
// kiln-images partition".
func TestNotKilnFiles(t *testing.T) {
	rs := newReleases(t)
	r := rs.recipe(t, "acme", "1.0.0", "")
	rs.mustKiln(t, "lock", r)
	stick, file := filepath.Join(rs.dir, "up.img"), filepath.Join(rs.dir, "up.bundle")
	rs.mustKiln(t, "bundle", r, "-o", stick, "--key", rs.key)
	rs.mustKiln(t, "bundle", r, "-o", file, "--format", "file", "--key", rs.key)

	write := func(name string, data []byte) string {
		p := filepath.Join(rs.dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	damaged := func(name, from string, edit func([]byte) []byte) string {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		return write(name, edit(data))
	}
	random := make([]byte, 64<<10)
	for i := range random {
		random[i] = byte(i*7919 + i/251)
	}
	notKiln := "is not a kiln disk (kiln build), an upgrade bundle or its stick image (kiln bundle) or a recovery stick image (kiln reflash-stick)"
	for _, tc := range []struct {
		name    string
		path    string
		want    []string
		inspect bool // kiln inspect shows it (exit 0)
	}{
		{"empty", write("empty", nil), []string{notKiln, "it is empty (0 bytes)"}, false},
		{"random", write("random", random), []string{notKiln, `neither a bundle header ("KILNBNDL") nor a GPT partition table`}, false},
		{"bundle file with a flipped magic", damaged("flipped.bundle", file, func(b []byte) []byte { b[3] ^= 4; return b }),
			[]string{notKiln, `a few bits off a bundle's "KILNBNDL": a bundle file damaged at its start`}, false},
		{"stick short by one byte", damaged("short.img", stick, func(b []byte) []byte { return b[:len(b)-1] }),
			[]string{"it is truncated", "(1 byte missing"}, false},
		{"base image", filepath.Join(rs.dir, "base.raw"), []string{notKiln, `it is a GPT disk (partitions: 1 "BIOS-BOOT"`, "a base image?"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{{"verify", tc.path, "--key", rs.pub}, {"inspect", tc.path}} {
				msg, code := rs.kiln(t, args...)
				if args[0] == "inspect" && tc.inspect {
					if code != 0 {
						t.Errorf("kiln inspect %s: exit %d\n%s", tc.path, code, msg)
					}
					continue
				}
				if code != 1 {
					t.Errorf("kiln %s: exit %d, want 1\n%s", strings.Join(args, " "), code, msg)
				}
				for _, w := range tc.want {
					if !strings.Contains(msg, w) {
						t.Errorf("kiln %s: message lacks %q:\n%s", args[0], w, msg)
					}
				}
				if strings.Contains(msg, "CoreOS metal image") || strings.Contains(msg, "no kiln-images partition") {
					t.Errorf("kiln %s: the message is about base images or kiln disks:\n%s", args[0], msg)
				}
			}
		})
	}
}

// TestKeyNames (issue 26, messages): kiln key generate refuses, as a usage
// error, a NAME whose file name part is empty, hidden or already ends in
// .key or .pub (it wrote ".key" for ""), and writes nothing.
func TestKeyNames(t *testing.T) {
	dir := t.TempDir()
	f := &fixture{dir: dir, cache: filepath.Join(dir, "cache")}
	for _, tc := range []struct{ name, want string }{
		{"", `key name "": give a name such as factory`},
		{dir + "/", "give a name such as factory (or DIR/factory)"},
		{filepath.Join(dir, ".hidden"), "starting with a letter or digit"},
		{filepath.Join(dir, "factory.key"), "give it without .key or .pub (kiln key generate " + filepath.Join(dir, "factory") + " writes"},
	} {
		msg, code := kiln(t, f, "key", "generate", tc.name)
		if code != 2 || !strings.Contains(msg, tc.want) {
			t.Errorf("kiln key generate %q: exit %d, want 2 saying %q:\n%s", tc.name, code, tc.want, msg)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		t.Errorf("refused names wrote %v", ents)
	}
	if _, err := os.Stat(".key"); err == nil {
		t.Error("kiln key generate wrote .key in the working directory")
	}
}
