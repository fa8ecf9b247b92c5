package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/recipes"
)

// TestRefusedPaths (audit rows 6, 9, 10, 11): paths and addresses that
// cannot be right are refused at once with the reason, before any work
// (no lock written, nothing fetched) and with nothing touched.
func TestRefusedPaths(t *testing.T) {
	makeInputs(t)
	// A real block device: a loop device over a file, as a USB stick would be.
	backing := filepath.Join(t.TempDir(), "stick.img")
	stick := bytes.Repeat([]byte("stick content "), 1<<16)
	if err := os.WriteFile(backing, stick, 0o644); err != nil {
		t.Fatal(err)
	}
	loop := strings.TrimSpace(run(t, "losetup", "--find", "--show", backing))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })

	for _, tc := range []struct {
		name string
		args func(f *fixture) []string
		code int
		want []string // {dir} is the fixture's directory
	}{
		{"build -o a directory", func(f *fixture) []string { return []string{"build", f.recipe, "-o", f.dir} }, 1,
			[]string{"output {dir} is a directory", "-o {dir}/appliance.raw"}},
		{"build -o a symlink to a directory", func(f *fixture) []string {
			link := filepath.Join(f.dir, "link")
			os.Symlink(f.dir, link)
			return []string{"build", f.recipe, "-o", link}
		}, 1, []string{"is a directory"}},
		{"build -o a block device", func(f *fixture) []string { return []string{"build", f.recipe, "-o", loop} }, 1,
			[]string{"output " + loop + " is a device", "USB image writer or dd", "docs/technician.md"}},
		{"build -o a character device", func(f *fixture) []string { return []string{"build", f.recipe, "-o", "/dev/null"} }, 1,
			[]string{"output /dev/null is a device"}},
		{"inspect a directory", func(f *fixture) []string { return []string{"inspect", f.dir} }, 1,
			[]string{"{dir} is a directory", "disk image file"}},
		{"verify a directory", func(f *fixture) []string { return []string{"verify", f.dir} }, 1,
			[]string{"{dir} is a directory"}},
		{"serve on every interface", func(f *fixture) []string {
			return []string{"serve", "--listen", "0.0.0.0:5050", f.dir}
		}, 2, []string{`"0.0.0.0:5050"`, "loopback", "--allow-non-loopback"}},
		{"serve on a LAN address", func(f *fixture) []string {
			return []string{"serve", "--listen", "192.168.1.10:5050", f.dir}
		}, 2, []string{"loopback", "--allow-non-loopback"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "base.raw", "fit", "false")
			args := tc.args(f)
			msg, code := kiln(t, f, args...)
			if code != tc.code {
				t.Fatalf("kiln %s: exit %d, want %d\n%s", strings.Join(args, " "), code, tc.code, msg)
			}
			for _, w := range tc.want {
				w = strings.ReplaceAll(w, "{dir}", f.dir)
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
			if _, err := os.Stat(recipes.LockPath(f.recipe)); err == nil {
				t.Errorf("a lock was written: the build went on before refusing")
			}
			if tmps, _ := filepath.Glob(filepath.Join(f.dir, ".*kiln-tmp-*")); len(tmps) > 0 {
				t.Errorf("temp files left: %v", tmps)
			}
		})
	}
	// The stick is still a block device with its content.
	if fi, err := os.Stat(loop); err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Errorf("%s is no longer a device: %v %v", loop, fi, err)
	}
	if got, err := os.ReadFile(backing); err != nil || !bytes.Equal(got, stick) {
		t.Errorf("the stick's content changed (%v)", err)
	}
}

// TestServeAllowNonLoopback: with the flag, kiln serve listens where told.
func TestServeAllowNonLoopback(t *testing.T) {
	makeInputs(t)
	cmd := exec.Command(kilnBin, "serve", "--allow-non-loopback", "--listen", "0.0.0.0:0", filepath.Join(inputs.dir, "oci"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "msg=ready") {
				ready <- sc.Text()
				return
			}
		}
		close(ready)
	}()
	select {
	case line, ok := <-ready:
		if !ok || !strings.Contains(line, "on 0.0.0.0:0") {
			t.Fatalf("kiln serve --allow-non-loopback did not become ready: %q", line)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("kiln serve --allow-non-loopback: not ready after 60s")
	}
}
