package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
)

// TestKilledBuildLeftovers (audit row 8): a build SIGKILLed mid-preload
// leaves its temporary disk, its staging tree and its preload run root;
// the next build removes them, but not those of a build that is still
// alive (stopped at the same step), nor names it cannot prove are its own.
func TestKilledBuildLeftovers(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "true") // one preloaded image
	tmp := filepath.Join(f.dir, "tmp")            // the builds' $TMPDIR
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(f.dir, "out.raw")
	// A build killed while containers/storage probes overlay leaves that
	// mount behind (the sweep then keeps its directory and says so); the
	// test unmounts after the builds are gone, before its temp dir goes.
	t.Cleanup(func() {
		ms, err := layers.MountsUnder(f.dir)
		if err != nil {
			t.Error(err)
		}
		for _, m := range ms {
			if out, err := exec.Command("umount", m).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v\n%s", m, err, out)
			}
		}
	})
	mustKiln(t, f, "lock", f.recipe) // so every build below starts fetching at once

	// The stopped build first, so the killed one (which sweeps too as it
	// starts) must leave it alone as well.
	alive := stopAtPreload(t, f, tmp, out, syscall.SIGSTOP)
	dead := stopAtPreload(t, f, tmp, out, syscall.SIGKILL)
	if len(dead) != 3 || len(alive) != 3 {
		t.Fatalf("the killed build left %v, the stopped one %v; want each a temporary disk, a staging tree and a preload run root", dead, alive)
	}
	// Names kiln cannot prove are its own: an older kiln's, and another
	// program's that happens to share a prefix.
	foreign := []string{filepath.Join(f.cache, "kiln", "build-123456789"), filepath.Join(tmp, "kiln-preload-run-mine")}
	for _, p := range foreign {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.Command(kilnBin, "build", f.recipe, "-o", out)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+f.cache, "TMPDIR="+tmp)
	msg, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build after a killed one: %v\n%s", err, msg)
	}
	for _, p := range dead {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the killed build's %s is still there", p)
		}
		if !strings.Contains(string(msg), "removed "+p+", left by a build that was killed") {
			t.Errorf("the build does not say it removed %s:\n%s", p, msg)
		}
	}
	for _, p := range append(alive, foreign...) {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was removed though its owner is alive or unknown: %v", p, err)
		}
	}
	mustKiln(t, f, "verify", out)
}

// stopAtPreload starts a build and sends it sig as soon as its preload run
// root appears in tmp, so it stops (SIGSTOP) or dies (SIGKILL) mid-preload,
// with its temporary disk and staging tree also on disk. It returns the
// entries the build owns (their names carry its PID). A stopped build is
// killed when the test ends. A build can finish before it is caught; it is
// then run again, a few times at most.
func stopAtPreload(t *testing.T, f *fixture, tmp, out string, sig syscall.Signal) []string {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		before, _ := filepath.Glob(filepath.Join(tmp, "kiln-preload-run-*"))
		cmd := exec.Command(kilnBin, "build", f.recipe, "-o", out)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+f.cache, "TMPDIR="+tmp)
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		caught := false
		for !caught {
			select {
			case <-done:
			case <-time.After(time.Millisecond):
				now, _ := filepath.Glob(filepath.Join(tmp, "kiln-preload-run-*"))
				if len(now) > len(before) {
					cmd.Process.Signal(sig)
					caught = true
				}
				continue
			}
			break
		}
		if !caught {
			continue // finished first: try again
		}
		if sig == syscall.SIGKILL {
			<-done
		} else {
			t.Cleanup(func() { cmd.Process.Kill(); <-done })
		}
		tag := "." + strconv.Itoa(cmd.Process.Pid) + "."
		var owned []string
		for _, pattern := range []string{
			filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".kiln-tmp-*"),
			filepath.Join(f.cache, "kiln", "build-*"),
			filepath.Join(tmp, "kiln-preload-run-*"),
		} {
			m, _ := filepath.Glob(pattern)
			for _, p := range m {
				if strings.Contains(filepath.Base(p), tag) {
					owned = append(owned, p)
				}
			}
		}
		return owned
	}
	t.Fatalf("no build was caught mid-preload in 5 attempts")
	return nil
}
