package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/recipes"
)

// TestEditedLockIsRefused (issue 26, item 10): a lock whose index digests
// are swapped between two images, or whose size for an image is off by
// one, built a disk (the wrong size in its kiln.json). Now the build fails
// at the lock entry's line, from a cold cache and from a warm one, and the
// previous output stays.
func TestEditedLockIsRefused(t *testing.T) {
	lockLine := regexp.MustCompile(`(?m)^\s+(indexDigest|size): (.*)$`)
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, lock string)
		want []string // regular expressions
	}{
		{"swapped index digests", func(t *testing.T, lock string) {
			data, _ := os.ReadFile(lock)
			var idx []string
			for _, m := range lockLine.FindAllStringSubmatch(string(data), -1) {
				if m[1] == "indexDigest" {
					idx = append(idx, m[2])
				}
			}
			if len(idx) != 2 {
				t.Fatalf("the lock has %d index digests, want 2:\n%s", len(idx), data)
			}
			s := strings.Replace(string(data), idx[0], "SWAP", 1)
			s = strings.Replace(s, idx[1], idx[0], 1)
			os.WriteFile(lock, []byte(strings.Replace(s, "SWAP", idx[1], 1)), 0o644)
			// Either image may be fetched first: both entries are wrong.
		}, []string{`appliance\.lock:(10:18: images\[0\]|16:18: images\[1\])\.indexDigest: `, "not the locked digest", "kiln lock"}},
		{"size off by one", func(t *testing.T, lock string) {
			data, _ := os.ReadFile(lock)
			m := lockLine.FindAllStringSubmatch(string(data), -1)
			size := m[len(m)-1][2] // the second image's
			replaceInFile(t, lock, "size: "+size+"\n", "size: "+size[:len(size)-1]+string(size[len(size)-1]^1)+"\n")
		}, []string{`appliance\.lock:18:11: images\[1\]\.size: `, `bytes \(its manifest, config and layers as fetched\)`, "kiln lock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "base.raw", "fit", "false")
			out := filepath.Join(f.dir, "out.raw")
			mustKiln(t, f, "build", f.recipe, "-o", out) // warms the cache
			if err := os.WriteFile(out, []byte("previous disk"), 0o644); err != nil {
				t.Fatal(err)
			}
			tc.edit(t, recipes.LockPath(f.recipe))
			for _, cache := range []string{"warm", "cold"} {
				if cache == "cold" {
					os.RemoveAll(f.cache)
				}
				msg, code := kiln(t, f, "build", f.recipe, "-o", out)
				if code != 1 {
					t.Fatalf("%s cache: build with the edited lock: exit %d, want 1\n%s", cache, code, msg)
				}
				for _, w := range tc.want {
					if !regexp.MustCompile(w).MatchString(msg) {
						t.Errorf("%s cache: message lacks %q:\n%s", cache, w, msg)
					}
				}
				assertUntouched(t, f.dir, out)
			}
		})
	}
}
