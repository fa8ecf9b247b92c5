package output

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Check refuses every output the final rename would fail on or must not
// replace, and says what to give instead; a new file or an old output is
// fine.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	recipe := filepath.Join(dir, "recipe.yaml")
	must(os.WriteFile(recipe, []byte("recipe"), 0o644))
	must(os.Link(recipe, filepath.Join(dir, "hardlink")))
	must(os.Symlink(recipe, filepath.Join(dir, "symlink")))
	must(os.WriteFile(filepath.Join(dir, "old.raw"), []byte("old"), 0o644))
	must(syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	inputs := []Input{{"the recipe", recipe}, {"the recipe's lock file", filepath.Join(dir, "recipe.lock")}}

	for _, tc := range []struct {
		name, path string
		want       []string // "" for none
	}{
		{"a new file", filepath.Join(dir, "new.raw"), nil},
		{"an old output", filepath.Join(dir, "old.raw"), nil},
		{"nothing", "", []string{"no output file given (-o FILE)"}},
		{"a directory", dir, []string{"is a directory", "-o " + filepath.Join(dir, "appliance.raw")}},
		{"a device", "/dev/null", []string{"output /dev/null is a device, not a regular file", "USB image writer or dd", "docs/technician.md"}},
		{"a FIFO", filepath.Join(dir, "fifo"), []string{"is not a regular file (p"}},
		{"under a file", filepath.Join(recipe, "x.raw"), []string{"output " + filepath.Join(recipe, "x.raw"), "not a directory"}},
		{"an input", recipe, []string{"is the recipe", "would destroy it"}},
		{"a hard link to an input", filepath.Join(dir, "hardlink"), []string{"is the recipe"}},
		{"a symlink to an input", filepath.Join(dir, "symlink"), []string{"is the recipe"}},
		{"an input not written yet", filepath.Join(dir, ".", "recipe.lock"), []string{"is the recipe's lock file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.path, "appliance.raw", inputs)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Check(%q): %v", tc.path, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check(%q): no error", tc.path)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check(%q): %q lacks %q", tc.path, err, w)
				}
			}
		})
	}
}

// An output appears whole at Commit and not before; Discard, or a Commit
// after the run was interrupted, leaves the old output as it was and no
// temporary file.
func TestCommitAndDiscard(t *testing.T) {
	for _, tc := range []struct {
		name      string
		interrupt bool
		commit    bool
		want      string
	}{
		{"commit", false, true, "new"},
		{"discard", false, false, "old"},
		{"interrupted", true, true, "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "out.raw")
			if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Discard()
			if _, err := f.WriteString("new"); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(path); string(got) != "old" {
				t.Fatalf("the output changed before Commit: %q", got)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if tc.interrupt {
				cancel()
			}
			defer cancel()
			if tc.commit {
				if err := f.Commit(ctx); (err != nil) != tc.interrupt {
					t.Fatalf("Commit: %v", err)
				}
			}
			f.Discard()
			if got, _ := os.ReadFile(path); string(got) != tc.want {
				t.Errorf("output holds %q, want %q", got, tc.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("the directory holds %v, want the output alone", ents)
			}
		})
	}
}
