package bootentry

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func release11(t *testing.T) Entry {
	t.Helper()
	usr, err := UsrVerity{
		RootHash:     strings.Repeat("de1a0ac3", 8),
		DataPartUUID: "6E109E5E-B4C3-4016-9DF3-64C738DF42F5",
		HashPartUUID: "a48285ab-a349-4083-ae18-e26e32f0e64f",
		FSType:       "squashfs",
	}.Options()
	if err != nil {
		t.Fatal(err)
	}
	return Entry{
		ID: "kiln-1.1.0", Title: "Appliance 1.1.0", Version: "1.1.0",
		Linux: "/kiln/1.1.0/vmlinuz", Initrd: []string{"/kiln/1.1.0/initrd.img"},
		Options: append([]string{"root=LABEL=root", "rw", "console=ttyS0,115200"}, usr...),
	}
}

func TestEncodeGolden(t *testing.T) {
	e := release11(t)
	var b bytes.Buffer
	if err := e.Encode(&b); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "kiln-1.1.0.conf")
	if *update {
		os.WriteFile(golden, b.Bytes(), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("entry:\n%s\nwant (%s):\n%s", b.String(), golden, want)
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Entry)
		want string
	}{
		{"a counter in the ID", func(e *Entry) { e.ID = "kiln-1.1.0+3" }, "want letters"},
		{"a slash in the ID", func(e *Entry) { e.ID = "../kiln" }, "want letters"},
		{"no kernel", func(e *Entry) { e.Linux = "" }, "no kernel"},
		{"a relative kernel", func(e *Entry) { e.Linux = "kiln/vmlinuz" }, "must be absolute"},
		{"an initrd outside", func(e *Entry) { e.Initrd = []string{"/kiln/../../x"} }, "must be absolute"},
		{"a title of two lines", func(e *Entry) { e.Title = "a\noptions init=/bin/sh" }, "spans lines"},
		{"a parameter with a space", func(e *Entry) { e.Options = append(e.Options, "init=/bin/sh quiet") }, "holds a space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := release11(t)
			tc.edit(&e)
			err := e.Encode(new(bytes.Buffer))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Encode: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestFileNames(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Name
		bad  bool
	}{
		{"kiln-1.1.0.conf", Name{ID: "kiln-1.1.0"}, false},
		{"kiln-1.1.0+3.conf", Name{ID: "kiln-1.1.0", Counting: true, Left: 3}, false},
		{"kiln-1.1.0+2-1.conf", Name{ID: "kiln-1.1.0", Counting: true, Left: 2, Done: 1}, false},
		{"kiln-1.1.0+0-3.conf", Name{ID: "kiln-1.1.0", Counting: true, Done: 3}, true},
		{"kiln-1.0.efi", Name{ID: "kiln-1.0", UKI: true}, false},
		{"kiln-1.1.0+3.efi", Name{ID: "kiln-1.1.0", Counting: true, Left: 3, UKI: true}, false},
		{"kiln-1.1.0+0-3.efi", Name{ID: "kiln-1.1.0", Counting: true, Done: 3, UKI: true}, true},
	} {
		got, err := ParseFileName(tc.file)
		if err != nil || got != tc.want {
			t.Errorf("ParseFileName(%q) = %+v, %v; want %+v", tc.file, got, err, tc.want)
			continue
		}
		if got.Bad() != tc.bad || got.String() != tc.file {
			t.Errorf("%q: Bad %v, String %q", tc.file, got.Bad(), got.String())
		}
	}
	if FileName("kiln-1.1.0", 3) != "kiln-1.1.0+3.conf" || FileName("kiln-1.1.0", 0) != "kiln-1.1.0.conf" {
		t.Error("FileName")
	}
	if UKIFileName("kiln-1.1.0", 3) != "kiln-1.1.0+3.efi" || (Name{ID: "kiln-1.0", UKI: true}).Path() != "EFI/Linux/kiln-1.0.efi" || (Name{ID: "kiln-1.0"}).Path() != "loader/entries/kiln-1.0.conf" {
		t.Error("UKIFileName, Path")
	}
	if _, err := Decode("kiln-1.0.efi", strings.NewReader("linux /vmlinuz\n")); !errors.Is(err, ErrNotEntry) {
		t.Errorf("Decode of a unified kernel image's name: %v, want ErrNotEntry", err)
	}
	for _, bad := range []string{"kiln.txt", ".conf", ".efi", "kiln.EFI", "+3.conf", "kiln+x.conf", "kiln+3-.conf", "kiln+-1.conf", "kiln+99999.conf"} {
		if _, err := ParseFileName(bad); err == nil {
			t.Errorf("ParseFileName(%q) accepted it", bad)
		} else if bad == "kiln.txt" && !errors.Is(err, ErrNotEntry) {
			t.Errorf("%q: %v, want ErrNotEntry", bad, err)
		}
	}
}

func TestUsrVerityRefuses(t *testing.T) {
	good := UsrVerity{RootHash: strings.Repeat("a", 64), DataPartUUID: "6e109e5e-b4c3-4016-9df3-64c738df42f5", HashPartUUID: "a48285ab-a349-4083-ae18-e26e32f0e64f", FSType: "squashfs"}
	for _, u := range []UsrVerity{
		{RootHash: strings.Repeat("A", 64), DataPartUUID: good.DataPartUUID, HashPartUUID: good.HashPartUUID, FSType: "squashfs"},
		{RootHash: good.RootHash, DataPartUUID: "LABEL=usr", HashPartUUID: good.HashPartUUID, FSType: "squashfs"},
		{RootHash: good.RootHash, DataPartUUID: good.DataPartUUID, HashPartUUID: good.HashPartUUID, FSType: "squashfs rw"},
	} {
		if _, err := u.Options(); err == nil {
			t.Errorf("Options accepted %+v", u)
		}
	}
	if _, err := good.Options(); err != nil {
		t.Error(err)
	}
}

// TestDecodeRoundTrip: what Encode writes, Decode reads back; the ID comes
// from the file name with its counter removed.
func TestDecodeRoundTrip(t *testing.T) {
	e := release11(t)
	var b bytes.Buffer
	if err := e.Encode(&b); err != nil {
		t.Fatal(err)
	}
	got, err := Decode(FileName(e.ID, 3), strings.NewReader("# written by kiln\n"+b.String()+"machine-id 0123\noptions quiet\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := e
	want.Options = append(append([]string{}, e.Options...), "quiet")
	if got.ID != want.ID || got.Title != want.Title || got.Version != want.Version || got.Linux != want.Linux ||
		strings.Join(got.Initrd, ",") != strings.Join(want.Initrd, ",") || strings.Join(got.Options, " ") != strings.Join(want.Options, " ") {
		t.Errorf("Decode = %+v, want %+v", got, want)
	}
	if _, err := Decode("loader.conf.bak", strings.NewReader("")); !errors.Is(err, ErrNotEntry) {
		t.Errorf("not an entry's name: %v", err)
	}
}

func TestParseUsrVerity(t *testing.T) {
	e := release11(t)
	u, ok, err := ParseUsrVerity(e.Options)
	if err != nil || !ok {
		t.Fatalf("ParseUsrVerity = %v, %v", ok, err)
	}
	want := UsrVerity{RootHash: strings.Repeat("de1a0ac3", 8), DataPartUUID: "6e109e5e-b4c3-4016-9df3-64c738df42f5",
		HashPartUUID: "a48285ab-a349-4083-ae18-e26e32f0e64f", FSType: "squashfs"}
	if u != want {
		t.Errorf("ParseUsrVerity = %+v, want %+v", u, want)
	}
	if _, ok, err := ParseUsrVerity([]string{"root=LABEL=root", "rw"}); ok || err != nil {
		t.Errorf("no slot: %v, %v", ok, err)
	}
	if _, _, err := ParseUsrVerity([]string{"usrhash=" + want.RootHash}); err == nil || !strings.Contains(err.Error(), "systemd.verity_usr_data=PARTUUID=") {
		t.Errorf("root hash alone: %v", err)
	}
}
