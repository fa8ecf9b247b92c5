//go:build !nodeonly

package main

import (
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// A stick's manifest is unsigned bytes until verify checks it: inspect
// prints its strings quoted when they carry ESC, newline or NUL, and never
// lets them act on the terminal.
func TestInspectBundleQuotesStickStrings(t *testing.T) {
	m := &bundlefmt.Manifest{Recipe: "acme", Version: "1.1.0\x1b[2J\x1b]0;pwned\a", Arch: "amd64", Kind: bundlefmt.KindFull,
		Images:       []bundlefmt.Image{{Image: contract.Image{Name: "registry/app\nok   forged", Digest: "sha256:0123456789abcdef"}}},
		ReleaseFiles: []contract.ReleaseFile{{Path: "etc/x\x00y", Mode: 0o644, Size: 1, Digest: "sha256:00"}},
	}
	var b strings.Builder
	if err := printBundle(&b, &bundle.Report{Path: "stick.img", Manifest: m}, "text"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsAny(out, "\x1b\a\x00") || strings.Contains(out, "\nok   forged") {
		t.Fatalf("raw control characters reach the terminal:\n%q", out)
	}
	for _, w := range []string{`"1.1.0\x1b[2J\x1b]0;pwned\a"`, `"registry/app\nok   forged"`, `"etc/x\x00y"`, "Bundle stick.img: acme "} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %s:\n%s", w, out)
		}
	}
}
