package human

import "testing"

func TestBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536 << 20: "1.5 GiB", 5 << 40: "5.0 TiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestQuote(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{
		"":                               "",
		"kiln-1.1.0.conf":                "kiln-1.1.0.conf",
		"acme 1.1 (ütf-8, quoted \"x\")": "acme 1.1 (ütf-8, quoted \"x\")",
		"1.0\x1b[2J\x1b]0;pwned\x07":     `"1.0\x1b[2J\x1b]0;pwned\a"`,
		"a\nok  forged line":             `"a\nok  forged line"`,
		"nul\x00":                        `"nul\x00"`,
		"tab\there":                      `"tab\there"`,
		"\u202eevil":                     `"\u202eevil"`,
		"bad\xffutf8":                    `"bad\xffutf8"`,
	} {
		if got := Quote(s); got != want {
			t.Errorf("Quote(%q) = %s, want %s", s, got, want)
		}
	}
}
