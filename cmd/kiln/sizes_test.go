package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/recipes"
)

// TestSizeErrors (issue 26, item 11): a fixed disk.size or
// imagePartition.size that cannot fit is refused at the recipe line that
// sets it, as early as what it must hold is known: before anything is
// fetched or the lock is written when the base or the node's kiln alone do
// not fit, after the fetch with the exact size otherwise; and the size the
// message asks for builds.
func TestSizeErrors(t *testing.T) {
	makeInputs(t)
	agent, err := os.Stat(filepath.Join(filepath.Dir(kilnBin), "kiln-agent"))
	if err != nil {
		t.Fatal(err)
	}
	// The images' sizes as a lock gives them.
	lf := newFixture(t, "base.raw", "fit", "false")
	mustKiln(t, lf, "lock", lf.recipe)
	lock, err := recipes.ReadLock(recipes.LockPath(lf.recipe))
	if err != nil {
		t.Fatal(err)
	}
	var largest int64 // both images are served
	for _, img := range lock.Images {
		largest = max(largest, img.Size)
	}
	const seal = 64 << 10
	bytes := func(n int64) string { return strconv.FormatInt(n, 10) + "B" }
	early := []string{"the exact size is said once they are fetched"}
	for _, tc := range []struct {
		name      string
		diskSize  string
		partition string // imagePartition.size, "" for auto
		lockFirst bool   // lock before the build (then the served image's size is known too)
		want      []string
		wrote     bool // the build fetched: a lock was written
	}{
		{name: "disk smaller than the base", diskSize: "64MiB",
			want: []string{"appliance.yaml:9:9: disk.size: disk size 64 MiB is too small: the base alone needs"}},
		{name: "partition smaller than the agent", diskSize: "fit", partition: "4MiB",
			want: append([]string{"appliance.yaml:16:9: imagePartition.size: image partition size 4 MiB is too small", "the node's kiln binary"}, early...)},
		{name: "partition smaller than the agent and the served image", diskSize: "fit", partition: bytes(agent.Size() + seal + largest/2), lockFirst: true,
			want: append([]string{"appliance.yaml:16:9: imagePartition.size:", "the largest served image, "}, early...)},
		{name: "partition too small for the filesystem", diskSize: "fit", partition: bytes(agent.Size() + seal + largest + 1),
			want: []string{"appliance.yaml:16:9: imagePartition.size:", "the image filesystem (with its verity tree and kiln's seal) needs"}, wrote: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "base.raw", tc.diskSize, "false")
			if tc.partition != "" {
				appendFile(t, f.recipe, "imagePartition:\n  size: "+tc.partition+"\n")
			}
			if tc.lockFirst {
				mustKiln(t, f, "lock", f.recipe)
			}
			out := filepath.Join(f.dir, "out.raw")
			msg, code := kiln(t, f, "build", f.recipe, "-o", out)
			if code != 1 {
				t.Fatalf("build: exit %d, want 1\n%s", code, msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
			_, err := os.Stat(recipes.LockPath(f.recipe))
			if wrote := err == nil; wrote != (tc.wrote || tc.lockFirst) {
				t.Errorf("lock written: %v, want %v", wrote, tc.wrote || tc.lockFirst)
			}
			// The size the message asks for builds.
			m := regexp.MustCompile(`set (disk\.size|imagePartition\.size) to at least ([0-9.]+ [MG]iB)`).FindStringSubmatch(msg)
			if !tc.wrote {
				return
			}
			if m == nil {
				t.Fatalf("the message names no size to set:\n%s", msg)
			}
			size := strings.ReplaceAll(m[2], " ", "")
			replaceInFile(t, f.recipe, "  size: "+tc.partition+"\n", "  size: "+size+"\n")
			if msg, code := kiln(t, f, "build", f.recipe, "-o", out); code != 0 {
				t.Fatalf("build with %s: %s: exit %d\n%s", m[1], size, code, msg)
			}
		})
	}
}
