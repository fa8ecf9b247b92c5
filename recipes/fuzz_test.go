package recipes

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad feeds arbitrary bytes to the recipe and lock parsers: they must
// never panic, and every problem must come back as positioned errors.
//
//	go test -tags … -run '^$' -fuzz FuzzLoad -fuzztime 1000000x ./recipes/
//
// (A count, not a duration: with a duration the exec counter only updates
// at the end on a busy machine.)
func FuzzLoad(f *testing.F) {
	examples, _ := filepath.Glob("examples/*.yaml")
	for _, e := range examples {
		data, err := os.ReadFile(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		head + oneImage,
		head + "images:\n  - &a {name: quay.io/acme/app:1.2}\n  - *a\n",
		head + "images: [\n",
		"a: &a [*a, *a]\n",
		"? [a, b]\n: c\n",
		"--- !!map\n!!str apiVersion: !!binary aGVsbG8=\n",
		"kind: Lock\nimages: [{size: 99999999999999999999999}]\n",
		// Names go-containerregistry accepts and the distribution grammar does not.
		head + "images:\n  - name: quay.io/../../etc/passwd:1.0\n  - name: quay.io//x:1\n  - name: ..:5000/x:1\n",
		"kind: Lock\nimages: [{name: quay.io/./x:1, source: docker://quay.io/./x:1}]\n",
		"disk: {size: 9223372036854775807}\nimagePartition: {headroom: -9223372036854775808}\n",
		// Inputs that once crashed yaml.v3 (go-yaml/yaml #323, #560, #665, #666, #744, #833).
		"\"\\0\\\r\n", "  0: [\n] 0", "? ? \"\n\" 0", "    - {\n000}0", " \ufeff\n", "? \ufeff: \ufeff\n",
		"a:\n.\n-\n", "#\n-\n-\n0", "0: [:!00 \xef", "#\n - - QI\xd7", "! !00 \xf6", "{{},<<}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, parse := range []func() (any, error){
			func() (any, error) { return Parse("f.yaml", data) },
			func() (any, error) { return ParseLock("f.lock", data) },
		} {
			v, err := parse()
			if err == nil {
				if v == nil {
					t.Fatal("nil result and nil error")
				}
				continue
			}
			list, ok := err.(ErrorList)
			if !ok || len(list) == 0 {
				t.Fatalf("error is not a non-empty ErrorList: %#v", err)
			}
		}
	})
}
