package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Both editions say which kiln they are.
func TestVersionFlag(t *testing.T) {
	for bin, want := range map[string][]string{
		kilnBin: {"kiln ", "\ncommit: ", "\ngo: " + runtime.Version() + "\n", "\nedition: factory\n"},
		filepath.Join(filepath.Dir(kilnBin), "kiln-agent"): {"kiln-agent ", "\ngo: " + runtime.Version() + "\n", "\nedition: node\n"},
	} {
		out, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --version: %v\n%s", bin, err, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s --version lacks %q:\n%s", filepath.Base(bin), w, out)
			}
		}
	}
}

// The Makefile stamps version and commit at link time (-X): --version says
// them, and the same stamp gives the same binary (a reproducible build; a
// build time or path in the stamp would break it).
func TestVersionStampIsReproducible(t *testing.T) {
	const pkg = "github.com/kiln-appliance/kiln/internal/version"
	ldflags := "-s -w -X " + pkg + ".version=v9.8.7-1-gabcdef0 -X " + pkg + ".commit=abcdef0123456789abcdef0123456789abcdef01"
	var bins [][]byte
	for _, dir := range []string{t.TempDir(), t.TempDir()} {
		out := filepath.Join(dir, "kiln-agent")
		build := exec.Command("go", "build", "-tags", "containers_image_openpgp,exclude_graphdriver_btrfs,nodeonly", "-trimpath", "-ldflags", ldflags, "-o", out, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, msg)
		}
		v, err := exec.Command(out, "--version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(v), "kiln-agent v9.8.7-1-gabcdef0\ncommit: abcdef0123456789abcdef0123456789abcdef01\n") {
			t.Errorf("stamped --version: %v\n%s", err, v)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		bins = append(bins, b)
	}
	if !bytes.Equal(bins[0], bins[1]) {
		t.Error("two builds with the same stamp differ")
	}
}
