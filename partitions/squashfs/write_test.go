package squashfs

import "testing"

// A path mksquashfs's pseudo file cannot carry is refused, not mangled.
func TestAttrsBadPath(t *testing.T) {
	for _, p := range []string{"", "/abs", "a b", "a\nb"} {
		if _, err := writeAttrs("", []FileAttrs{{Path: p, Mode: 0o644}}); err == nil {
			t.Errorf("writeAttrs(%q): no error", p)
		}
	}
}
