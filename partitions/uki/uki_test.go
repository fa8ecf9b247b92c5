package uki

import (
	"bytes"
	"context"
	"debug/pe"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/internal/hosttools"
	"github.com/kiln-appliance/kiln/internal/secureboot"
)

const (
	testCmdline = "mount.usr=/dev/disk/by-partlabel/usr-a usrhash=b2e4228ca6fb34ff3dbf3e8ddd0fe4ad4a1eac87cf737b97295d7d321a118471 console=ttyS0 quiet"
	testOSRel   = "NAME=\"acme appliance\"\nID=acme\nVERSION_ID=1.0\nIMAGE_VERSION=1.0\n"
)

// randomFile writes n bytes that compress to nothing: objcopy does not
// care what a kernel holds, and a test that a byte is in its place needs
// bytes that differ.
func randomFile(t *testing.T, dir, name string, n int, seed uint64) (string, []byte) {
	t.Helper()
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

type built struct {
	path                           string
	kernel, initrd, cmdline, osrel []byte
}

func build(t *testing.T) built {
	t.Helper()
	dir := t.TempDir()
	kernel, kb := randomFile(t, dir, "vmlinuz", 300_001, 1) // odd sizes: alignment shows
	i1, b1 := randomFile(t, dir, "initrd-1", 70_003, 2)
	i2, b2 := randomFile(t, dir, "initrd-2", 5_000, 3)
	out := filepath.Join(dir, "acme-1.0.efi")
	err := Build(context.Background(), out, Inputs{Kernel: kernel, Initrds: []string{i1, i2}, Cmdline: testCmdline, OSRelease: []byte(testOSRel)})
	if err != nil {
		t.Fatal(err)
	}
	return built{path: out, kernel: kb, initrd: append(b1, b2...), cmdline: []byte(testCmdline), osrel: []byte(testOSRel)}
}

func TestBuild(t *testing.T) {
	u := build(t)
	stub, err := pe.Open(Stub)
	if err != nil {
		t.Fatal(err)
	}
	defer stub.Close()
	stubEnd := uint64(stub.OptionalHeader.(*pe.OptionalHeader64).SizeOfImage)
	stubAlign := stub.OptionalHeader.(*pe.OptionalHeader64).SectionAlignment

	f, err := pe.Open(u.path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tt := range []struct {
		name string
		want []byte
	}{{".osrel", u.osrel}, {".cmdline", u.cmdline}, {".linux", u.kernel}, {".initrd", u.initrd}} {
		t.Run(tt.name, func(t *testing.T) {
			s := f.Section(tt.name)
			if s == nil {
				t.Fatal("no such section")
			}
			got, err := sectionBytes(s)
			if err != nil {
				t.Fatal(err)
			}
			if int(s.VirtualSize) != len(tt.want) || !bytes.Equal(got, tt.want) {
				t.Errorf("%d bytes (virtual size %d), want the %d given", len(got), s.VirtualSize, len(tt.want))
			}
			if uint64(s.VirtualAddress) < stubEnd {
				t.Errorf("at %#x, inside the stub's image (ends at %#x)", s.VirtualAddress, stubEnd)
			}
			if s.VirtualAddress%4096 != 0 || s.VirtualAddress%stubAlign != 0 {
				t.Errorf("at %#x: not aligned to a page and the stub's %#x", s.VirtualAddress, stubAlign)
			}
		})
	}
	// The stub's own sections are where they were.
	for _, s := range stub.Sections {
		if g := f.Section(s.Name); g == nil || g.VirtualAddress != s.VirtualAddress || g.VirtualSize != s.VirtualSize {
			t.Errorf("the stub's section %s moved or is gone", s.Name)
		}
	}

	// No two sections share an address in memory or a byte in the file.
	type span struct {
		name       string
		start, end uint64
	}
	var mem, file []span
	for _, s := range f.Sections {
		mem = append(mem, span{s.Name, uint64(s.VirtualAddress), uint64(s.VirtualAddress) + uint64(memSize(s))})
		file = append(file, span{s.Name, uint64(s.Offset), uint64(s.Offset) + uint64(s.Size)})
	}
	for what, spans := range map[string][]span{"memory": mem, "file": file} {
		slices.SortFunc(spans, func(a, b span) int { return int(a.start) - int(b.start) })
		for i := 1; i < len(spans); i++ {
			if spans[i].start < spans[i-1].end {
				t.Errorf("in %s, %s (%#x) overlaps %s (ends at %#x)", what, spans[i].name, spans[i].start, spans[i-1].name, spans[i-1].end)
			}
		}
	}
	if last := mem[len(mem)-1]; uint64(f.OptionalHeader.(*pe.OptionalHeader64).SizeOfImage) < last.end {
		t.Errorf("SizeOfImage %#x ends before %s (%#x)", f.OptionalHeader.(*pe.OptionalHeader64).SizeOfImage, last.name, last.end)
	}

	s, err := Read(u.path)
	if err != nil {
		t.Fatal(err)
	}
	if s.Cmdline != testCmdline || string(s.OSRelease) != testOSRel {
		t.Errorf("Read: %+v", s)
	}
	if h, ok := s.Param("usrhash"); !ok || h != "b2e4228ca6fb34ff3dbf3e8ddd0fe4ad4a1eac87cf737b97295d7d321a118471" {
		t.Errorf("usrhash %q %v", h, ok)
	}
}

// Bad input is refused with what to do, and out is not written.
func TestBuildRefuses(t *testing.T) {
	dir := t.TempDir()
	kernel, _ := randomFile(t, dir, "vmlinuz", 1000, 1)
	notPE := filepath.Join(dir, "stub.txt")
	if err := os.WriteFile(notPE, []byte("not an EFI program\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notStub := "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
	already := build(t).path
	good := Inputs{Kernel: kernel, Cmdline: testCmdline, OSRelease: []byte(testOSRel)}
	with := func(f func(*Inputs)) Inputs { in := good; f(&in); return in }
	for _, tt := range []struct {
		name string
		in   Inputs
		path string // $PATH, if set
		want string
	}{
		{"stub not PE", with(func(in *Inputs) { in.Stub = notPE }), "", "stub " + notPE + " is not a PE image"},
		{"stub missing", with(func(in *Inputs) { in.Stub = filepath.Join(dir, "nosuch.stub") }), "", "apt-get install systemd-boot-efi"},
		{"not systemd-stub", with(func(in *Inputs) { in.Stub = notStub }), "", `is a PE image but not systemd-stub (.sdmagic "#### LoaderInfo: systemd-boot `},
		{"stub already a UKI", with(func(in *Inputs) { in.Stub = already }), "", "already has a .osrel section"},
		{"no command line", with(func(in *Inputs) { in.Cmdline = " \n" }), "", "no command line given"},
		{"no os-release", with(func(in *Inputs) { in.OSRelease = nil }), "", "no os-release given"},
		{"no kernel", with(func(in *Inputs) { in.Kernel = "" }), "", "no kernel given"},
		{"kernel missing", with(func(in *Inputs) { in.Kernel = filepath.Join(dir, "nosuch") }), "", ".linux: stat " + dir + "/nosuch"},
		{"initrd missing", with(func(in *Inputs) { in.Initrds = []string{kernel, filepath.Join(dir, "nosuch")} }), "", "initrd: open " + dir + "/nosuch"},
		{"objcopy missing", good, t.TempDir(), "objcopy (Debian package binutils); install them as root with: apt-get install binutils"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.path != "" {
				t.Setenv("PATH", tt.path)
			}
			outDir := t.TempDir()
			err := Build(context.Background(), filepath.Join(outDir, "uki.efi"), tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Build: %v, want an error saying %q", err, tt.want)
			}
			t.Log(err)
			if ents, _ := os.ReadDir(outDir); len(ents) > 0 {
				t.Errorf("left %v", ents)
			}
		})
	}
}

var keys struct{ db, other string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "uki-test-")
	if err != nil {
		panic(err)
	}
	keys.db, keys.other = filepath.Join(dir, "factory"), filepath.Join(dir, "other")
	for _, d := range []string{keys.db, keys.other} {
		if err := secureboot.Generate(context.Background(), d); err != nil {
			os.RemoveAll(dir)
			panic(err)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func dbKey(dir string) (key, cert string) {
	return secureboot.Key(dir, secureboot.DB), secureboot.Cert(dir, secureboot.DB)
}

// flip changes one byte of a file at the given offset.
func flip(t *testing.T, p string, off int64) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x01
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// sectionOffset is where a section's bytes start in the file.
func sectionOffset(t *testing.T, p, name string) int64 {
	t.Helper()
	f, err := pe.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return int64(f.Section(name).Offset)
}

func TestSignAndVerify(t *testing.T) {
	ctx := context.Background()
	key, cert := dbKey(keys.db)
	_, otherCert := dbKey(keys.other)
	uki := build(t).path
	for _, tt := range []struct {
		name    string
		file    string                            // signed into a copy, unless unsigned
		unsign  bool                              // left unsigned
		change  func(t *testing.T, signed string) // after signing
		cert    string
		wantErr error
	}{
		{name: "UKI signed with db", file: uki, cert: cert},
		{name: "systemd-boot signed with db", file: SystemdBoot, cert: cert},
		{name: "another factory's db", file: uki, cert: otherCert, wantErr: ErrBadSignature},
		{name: "unsigned UKI", file: uki, unsign: true, cert: cert, wantErr: ErrUnsigned},
		{name: "unsigned systemd-boot", file: SystemdBoot, unsign: true, cert: cert, wantErr: ErrUnsigned},
		{name: "not an EFI program", file: "/etc/os-release", unsign: true, cert: cert, wantErr: ErrUnsigned},
		{
			name: "command line changed by one byte", file: uki, cert: cert, wantErr: ErrBadSignature,
			change: func(t *testing.T, p string) { flip(t, p, sectionOffset(t, p, ".cmdline")+10) },
		},
		{
			name: "kernel changed by one byte", file: uki, cert: cert, wantErr: ErrBadSignature,
			change: func(t *testing.T, p string) { flip(t, p, sectionOffset(t, p, ".linux")+100_000) },
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			signed := filepath.Join(t.TempDir(), filepath.Base(tt.file))
			if tt.unsign {
				b, err := os.ReadFile(tt.file)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(signed, b, 0o644); err != nil {
					t.Fatal(err)
				}
			} else if err := Sign(ctx, tt.file, signed, key, cert); err != nil {
				t.Fatal(err)
			}
			if tt.change != nil {
				tt.change(t, signed)
			}
			err := Verify(ctx, signed, tt.cert)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.HasPrefix(err.Error(), signed+": ") {
				t.Fatalf("Verify: %v, want %v naming %s", err, tt.wantErr, signed)
			}
			t.Log(err)
		})
	}
}

// Signing keeps the UKI what it was: the same sections, readable.
func TestSignKeepsTheSections(t *testing.T) {
	key, cert := dbKey(keys.db)
	u := build(t)
	if err := Sign(context.Background(), u.path, u.path, key, cert); err != nil { // in place
		t.Fatal(err)
	}
	if err := Verify(context.Background(), u.path, cert); err != nil {
		t.Fatal(err)
	}
	s, err := Read(u.path)
	if err != nil {
		t.Fatal(err)
	}
	if s.Cmdline != testCmdline || string(s.OSRelease) != testOSRel {
		t.Errorf("Read after signing: %+v", s)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(u.path), ".*")); len(left) > 0 {
		t.Errorf("left %v", left)
	}
}

func TestSignRefuses(t *testing.T) {
	key, cert := dbKey(keys.db)
	kek := secureboot.Key(keys.db, secureboot.KEK)
	uki := build(t).path
	for _, tt := range []struct {
		name, in, key, cert, path, want string
	}{
		{name: "key of another certificate", in: uki, key: kek, cert: cert, want: "key " + kek + " does not match certificate " + cert},
		{name: "not an EFI program", in: secureboot.Cert(keys.db, secureboot.DB), key: key, cert: cert, want: "db.crt: it is not an EFI program (no PE header)"},
		{name: "sbsign missing", in: uki, key: key, cert: cert, path: t.TempDir(), want: "apt-get install sbsigntool"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.path != "" {
				t.Setenv("PATH", tt.path)
			}
			dir := t.TempDir()
			err := Sign(context.Background(), tt.in, filepath.Join(dir, "signed.efi"), tt.key, tt.cert)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Sign: %v, want an error saying %q", err, tt.want)
			}
			t.Log(err)
			if strings.Contains(err.Error(), "gaps between PE/COFF sections") {
				t.Errorf("Sign: the stub's harmless warning hides the message: %v", err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) > 0 {
				t.Errorf("left %v", ents)
			}
		})
	}
}

func TestVerifyMissingTool(t *testing.T) {
	_, cert := dbKey(keys.db)
	t.Setenv("PATH", t.TempDir())
	err := Verify(context.Background(), SystemdBoot, cert)
	var me *hosttools.MissingError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "apt-get install sbsigntool") {
		t.Fatalf("Verify: %v, want sbverify named with its package", err)
	}
}

func TestRead(t *testing.T) {
	if _, err := Read(SystemdBoot); err == nil || !strings.Contains(err.Error(), "is not a unified kernel image: no .linux section") {
		t.Errorf("Read(systemd-boot): %v", err)
	}
	if _, err := Read("/etc/os-release"); err == nil || !strings.Contains(err.Error(), "/etc/os-release is not a unified kernel image") {
		t.Errorf("Read(os-release): %v", err)
	}
}

func TestParam(t *testing.T) {
	s := Sections{Cmdline: "root=/dev/a usrhash=1 quiet usrhash=2 mount.usrflags=ro rd.x="}
	for _, tt := range []struct {
		name, want string
		found      bool
	}{
		{"usrhash", "2", true}, // the last one, as the kernel takes it
		{"quiet", "", true},
		{"rd.x", "", true},
		{"usr", "", false},
		{"root", "/dev/a", true},
	} {
		if got, ok := s.Param(tt.name); got != tt.want || ok != tt.found {
			t.Errorf("Param(%q) = %q, %v; want %q, %v", tt.name, got, ok, tt.want, tt.found)
		}
	}
}
