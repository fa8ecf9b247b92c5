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
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, lock string)
		want []string // regular expressions
	}{
		{"swapped index digests", swapIndexDigests, swappedIndexDigests},
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

// lockLine finds a lock entry's index digest or size.
var lockLine = regexp.MustCompile(`(?m)^\s+(indexDigest|size): (.*)$`)

// swapIndexDigests swaps the index digests of the lock's two images.
func swapIndexDigests(t *testing.T, lock string) {
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
}

// swappedIndexDigests is what refusing swapIndexDigests's lock says.
// Either image may be fetched first: both entries are wrong.
var swappedIndexDigests = []string{`appliance\.lock:(10:18: images\[0\]|16:18: images\[1\])\.indexDigest: `, "not the locked digest", "kiln lock"}

// TestBundleRefusesEditedLock: a bundle asks the cache for the lock's
// images as a build does (builder.FetchRequest), so a lock whose index
// digests were swapped is refused at its entry's line, from a warm cache,
// and the previous output stays. Before, the bundle checked no index digest
// and signed the release.
func TestBundleRefusesEditedLock(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	key := filepath.Join(f.dir, "factory")
	mustKiln(t, f, "key", "generate", key)
	appendFile(t, f.recipe, "trust: ["+key+".pub]\n")
	mustKiln(t, f, "lock", f.recipe)
	out := filepath.Join(f.dir, "upgrade.img")
	mustKiln(t, f, "bundle", f.recipe, "-o", out, "--key", key+".key") // warms the cache
	if err := os.WriteFile(out, []byte("previous disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	swapIndexDigests(t, recipes.LockPath(f.recipe))
	msg, code := kiln(t, f, "bundle", f.recipe, "-o", out, "--key", key+".key")
	if code != 1 {
		t.Fatalf("bundle with the edited lock: exit %d, want 1\n%s", code, msg)
	}
	for _, w := range swappedIndexDigests {
		if !regexp.MustCompile(w).MatchString(msg) {
			t.Errorf("message lacks %q:\n%s", w, msg)
		}
	}
	assertUntouched(t, f.dir, out)
}
