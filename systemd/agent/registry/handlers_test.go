package registry

import (
	"net/url"
	"strings"
	"testing"
)

// TestPageLexicalOrder: tags come in the spec's lexical order
// (case-insensitive), and n/last pagination walks that order exactly.
func TestPageLexicalOrder(t *testing.T) {
	all := []string{"v1", "B", "a", "V1", "latest", "Latest", "1.0"}
	sorted := append([]string(nil), all...)
	sortLexical(sorted)
	if got, want := strings.Join(sorted, " "), "1.0 a B Latest latest V1 v1"; got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
	for _, tc := range []struct{ query, want, next string }{
		{"", "1.0 a B Latest latest V1 v1", ""},
		{"n=2", "1.0 a", "n=2&last=a"},
		{"n=2&last=a", "B Latest", "n=2&last=Latest"},
		{"n=2&last=Latest", "latest V1", "n=2&last=V1"},
		{"n=2&last=V1", "v1", ""},
		{"last=b", "Latest latest V1 v1", ""},
		{"n=0", "", ""},
	} {
		q, _ := url.ParseQuery(tc.query)
		items, next, aerr := page(sorted, q)
		if aerr != nil || strings.Join(items, " ") != tc.want || next != tc.next {
			t.Errorf("page(%s) = %q, next %q, %v; want %q, next %q", tc.query, items, next, aerr, tc.want, tc.next)
		}
	}
}

// TestLexicalOrderAgrees: the allocation-free comparison orders every pair
// as comparing the lowercased strings, then the bytes, does.
func TestLexicalOrderAgrees(t *testing.T) {
	ref := func(a, b string) int {
		if c := strings.Compare(strings.ToLower(a), strings.ToLower(b)); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	}
	sign := func(c int) int { return min(max(c, -1), 1) }
	words := []string{"", "a", "A", "b", "B", "ab", "aB", "Ab", "a_", "a-", "a.", "1.0", "1.10", "1.9", "latest", "Latest",
		"v1", "V1", "_x", "Z", "z", "zz", "é", "É", "aé", "aÉ", "a\x7f", "[", "`", "{"}
	for _, a := range words {
		for _, b := range words {
			if got, want := sign(lexicalOrder(a, b)), ref(a, b); got != want {
				t.Errorf("lexicalOrder(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}
