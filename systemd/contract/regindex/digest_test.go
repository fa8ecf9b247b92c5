package regindex

import (
	"regexp"
	"strings"
	"testing"
)

// ValidDigest accepts exactly what the distribution grammar kiln serves
// allows, `^sha256:[a-f0-9]{64}$`, which it replaced at start-up's speed.
func TestValidDigest(t *testing.T) {
	grammar := regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	hex := strings.Repeat("0123456789abcdef", 4)
	for _, d := range []string{
		"sha256:" + hex,
		"sha256:" + strings.ToUpper(hex),
		"sha256:" + hex[:63],
		"sha256:" + hex + "0",
		"sha256:" + hex[:63] + "g",
		"sha256:" + hex[:62] + "é",
		"sha512:" + hex,
		"SHA256:" + hex,
		"sha256" + hex + "0",
		"sha256:" + hex + "\n",
		" sha256:" + hex,
		"", "sha256:",
	} {
		if got, want := ValidDigest(d), grammar.MatchString(d); got != want {
			t.Errorf("ValidDigest(%q) = %v, want %v", d, got, want)
		}
	}
}

func FuzzValidDigest(f *testing.F) {
	grammar := regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	f.Add("sha256:" + strings.Repeat("a", 64))
	f.Fuzz(func(t *testing.T, d string) {
		if got, want := ValidDigest(d), grammar.MatchString(d); got != want {
			t.Errorf("ValidDigest(%q) = %v, grammar says %v", d, got, want)
		}
	})
}
