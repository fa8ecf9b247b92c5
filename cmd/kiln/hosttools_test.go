package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A command whose host tools are missing names every one, with the
// apt-get line, and exits 1 before any work: no output, no lock written
// beside the recipe, no cache.
func TestMissingHostToolsRefusedBeforeAnyWork(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	// $PATH holds xz and mcopy only: debugfs and mksquashfs are missing.
	bin := t.TempDir()
	for _, tool := range []string{"xz", "mcopy"} {
		real, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(real, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(f.dir, "out.img")
	tests := []struct {
		args []string
		want string
	}{
		{
			args: []string{"build", f.recipe, "-o", out},
			want: "kiln: build: host tools not installed: debugfs (Debian package e2fsprogs), mksquashfs (Debian package squashfs-tools); " +
				"install them as root with: apt-get install e2fsprogs squashfs-tools\n",
		},
		{
			args: []string{"reflash-stick", f.recipe, "-o", out},
			want: "kiln: reflash-stick: host tools not installed: debugfs (Debian package e2fsprogs), mksquashfs (Debian package squashfs-tools); " +
				"install them as root with: apt-get install e2fsprogs squashfs-tools\n",
		},
		{
			args: []string{"bundle", f.recipe, "-o", out, "--key", filepath.Join(f.dir, "factory.key")},
			want: "kiln: bundle: host tools not installed: debugfs (Debian package e2fsprogs); install them as root with: apt-get install e2fsprogs\n",
		},
	}
	before := dirNames(t, f.dir)
	for _, tt := range tests {
		t.Run(tt.args[0], func(t *testing.T) {
			cmd := exec.Command(kilnBin, tt.args...)
			cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+f.cache, "PATH="+bin) // the last PATH wins
			got, err := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("exit %d (%v), want 1", code, err)
			}
			if string(got) != tt.want {
				t.Errorf("kiln said\n%s\nwant\n%s", got, tt.want)
			}
			if after := dirNames(t, f.dir); !slices.Equal(after, before) {
				t.Errorf("the recipe's directory held %v, now %v: work was done", before, after)
			}
		})
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}
