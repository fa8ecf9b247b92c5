package human

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Quote is s as a terminal may show it: as it is when every character of
// it prints, else quoted as Go quotes it (%q). A name, version or title read
// from a disk, stick or bundle is anyone's bytes: an ESC, a newline or a NUL
// in it then shows as \x1b, \n or \x00 and never moves the cursor, clears
// the screen or forges a line of the report. Ordinary names stay unquoted,
// so the output (and its golden files) reads as before.
func Quote(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
