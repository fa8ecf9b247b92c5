package hosttools

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pathWith makes a directory holding links to the real tools named and
// sets $PATH to it alone for the test.
func pathWith(t *testing.T, names ...string) {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		real, err := exec.LookPath(n)
		if err != nil {
			t.Fatalf("the test needs %s installed: %v", n, err)
		}
		if err := os.Symlink(real, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		path    []string // tools in $PATH
		check   []string
		wantErr string // "": none
		missing []string
	}{
		{name: "all there", path: []string{"debugfs", "mksquashfs"}, check: []string{"debugfs", "mksquashfs"}},
		{name: "nothing asked", check: nil},
		{
			name: "one missing", path: []string{"debugfs", "xz"}, check: []string{"debugfs", "mcopy", "xz"},
			wantErr: "host tools not installed: mcopy (Debian package mtools); install them as root with: apt-get install mtools",
			missing: []string{"mcopy"},
		},
		{
			name: "all missing, every one named", check: []string{"debugfs", "mksquashfs", "xz", "mcopy"},
			wantErr: "host tools not installed: debugfs (Debian package e2fsprogs), mksquashfs (Debian package squashfs-tools), " +
				"xz (Debian package xz-utils), mcopy (Debian package mtools); install them as root with: apt-get install e2fsprogs squashfs-tools xz-utils mtools",
			missing: []string{"debugfs", "mksquashfs", "xz", "mcopy"},
		},
		{
			name: "a tool kiln does not know", path: []string{"debugfs"}, check: []string{"debugfs", "sgdisk"},
			wantErr: `hosttools: "sgdisk" is not in the table of host tools`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pathWith(t, tt.path...)
			err := Check(tt.check...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Check: got %v\nwant %s", err, tt.wantErr)
			}
			var me *MissingError
			if !errors.As(err, &me) {
				if tt.missing != nil {
					t.Fatalf("Check: %T, want *MissingError", err)
				}
				return
			}
			var got []string
			for _, m := range me.Missing {
				got = append(got, m.Name)
			}
			if !slices.Equal(got, tt.missing) {
				t.Errorf("missing %v, want %v", got, tt.missing)
			}
			if !errors.Is(err, exec.ErrNotFound) {
				t.Error("errors.Is(err, exec.ErrNotFound) does not hold")
			}
		})
	}
}

func TestRunError(t *testing.T) {
	pathWith(t, "xz")
	tests := []struct {
		name    string
		args    []string
		keepOut bool // else the tool printed nothing
		want    string
	}{
		{
			name: "not installed: named with its package",
			args: []string{"mksquashfs", "/nonexistent", "/dev/null"},
			want: "xz /nonexistent: host tools not installed: mksquashfs (Debian package squashfs-tools); install them as root with: apt-get install squashfs-tools",
		},
		{
			name: "failed with output", args: []string{"xz", "-dc", "/nonexistent"}, keepOut: true,
			want: "xz /nonexistent: exit status 1: xz: /nonexistent: No such file or directory",
		},
		{
			name: "failed, printing nothing: no trailing colon", args: []string{"xz", "-dc", "/nonexistent"},
			want: "xz /nonexistent: exit status 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := exec.Command(tt.args[0], tt.args[1:]...).CombinedOutput()
			if err == nil {
				t.Fatalf("%v succeeded", tt.args)
			}
			if !tt.keepOut {
				out = []byte(" \n")
			}
			if got := RunError("xz /nonexistent", err, out).Error(); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// The table's package for each tool is the one that installs it, as dpkg
// knows it on this (Debian) machine.
func TestPackagesInstallTheTools(t *testing.T) {
	for _, tool := range Tools {
		out, err := exec.Command("dpkg-query", "-S", "*bin/"+tool.Name).CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg-query -S *bin/%s: %v: %s", tool.Name, err, out)
		}
		var pkgs []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, path, _ := strings.Cut(line, ": ")
			if filepath.Base(path) == tool.Name {
				pkgs = append(pkgs, pkg)
			}
		}
		if !slices.Contains(pkgs, tool.Package) {
			t.Errorf("%s is installed by %v, the table says %s", tool.Name, pkgs, tool.Package)
		}
	}
}

// aptPkgs is the Makefile's APT_PKGS, what `make deps` installs.
func aptPkgs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^APT_PKGS :=((?:.*\\\n)*.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no APT_PKGS in the Makefile")
	}
	return strings.Fields(strings.ReplaceAll(string(m[1]), "\\", " "))
}

// `make deps` installs every tool's package.
func TestMakeDepsInstallsThem(t *testing.T) {
	pkgs := aptPkgs(t)
	for _, tool := range Tools {
		if !slices.Contains(pkgs, tool.Package) {
			t.Errorf("APT_PKGS %v lacks %s (for %s)", pkgs, tool.Package, tool.Name)
		}
	}
}

// The README lists the same tools with the same packages, in the same order.
func TestREADMEListsTheTools(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, m := range regexp.MustCompile("(?m)^- `([^`]+)` \\(Debian package `([^`]+)`\\)").FindAllStringSubmatch(string(b), -1) {
		got = append(got, m[1]+" "+m[2])
	}
	for _, tool := range Tools {
		want = append(want, tool.Name+" "+tool.Package)
	}
	if !slices.Equal(got, want) {
		t.Errorf("README.md lists the host tools\n%q\nthe table has\n%q", got, want)
	}
}

// The README's prerequisites list the packages `make deps` installs.
func TestREADMEListsAptPkgs(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)Makefile's `APT_PKGS`.*?```\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md has no block of the Makefile's APT_PKGS")
	}
	if got, want := strings.Fields(string(m[1])), aptPkgs(t); !slices.Equal(got, want) {
		t.Errorf("README.md lists the Debian packages\n%q\nAPT_PKGS has\n%q", got, want)
	}
}

// Every program the factory's code runs by name is in the table. (The
// node's programs, under systemd/, run on the node's OS, not the factory.)
func TestTableCoversTheCode(t *testing.T) {
	run := regexp.MustCompile(`exec\.Command(?:Context)?\((?:ctx, )?"([^"]+)"`)
	found := map[string]string{}
	for _, dir := range []string{"builder", "partitions", "recipes", "ignition", "cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join("../..", dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range run.FindAllStringSubmatch(string(b), -1) {
				found[m[1]] = p
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(found) == 0 {
		t.Fatal("found no exec.Command in the factory's code: the pattern is stale")
	}
	for name, p := range found {
		if _, ok := Lookup(name); !ok {
			t.Errorf("%s runs %s, which is not in the table", p, name)
		}
	}
	for _, tool := range Tools {
		if _, ok := found[tool.Name]; !ok {
			t.Errorf("the table lists %s, which no factory code runs", tool.Name)
		}
	}
}
