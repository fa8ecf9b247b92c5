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
	"unsafe"

	"golang.org/x/sys/unix"

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

// TestKilledAtEachTemp (issue 26, item 9): kiln is SIGKILLed the moment
// each temporary file it writes outside its work directory appears — the
// lock's beside the recipe, a blob's in the cache — and the next run
// removes it; a kiln stopped (SIGSTOP) at the same point keeps its own.
// (What a build writes in its work directory — the staging tree, the
// Ignition config for debugfs, a verity tree to keep — goes with that
// directory: TestKilledBuildLeftovers.)
func TestKilledAtEachTemp(t *testing.T) {
	for _, point := range []struct {
		name   string
		dir    func(f *fixture) string // where the temporary file appears
		prefix string
		args   func(f *fixture) []string
	}{
		{"lock file", func(f *fixture) string { return f.dir }, ".appliance.lock.tmp-",
			func(f *fixture) []string { return []string{"lock", f.recipe} }},
		{"cached blob", func(f *fixture) string { return filepath.Join(f.cache, "kiln", "blobs", "sha256") }, ".tmp-",
			func(f *fixture) []string { return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw")} }},
	} {
		t.Run(point.name, func(t *testing.T) {
			f := newFixture(t, "base.raw", "fit", "true") // the preloaded image's blobs go through the cache
			if point.name != "lock file" {
				mustKiln(t, f, "lock", f.recipe)
			}
			dir := point.dir(f)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			alive := signalAtCreate(t, f, dir, point.prefix, syscall.SIGSTOP, point.args(f)...)
			dead := signalAtCreate(t, f, dir, point.prefix, syscall.SIGKILL, point.args(f)...)
			msg := mustKiln(t, f, point.args(f)...)
			if _, err := os.Lstat(dead); err == nil {
				t.Errorf("the killed kiln's %s is still there after the next run:\n%s", dead, msg)
			}
			if _, err := os.Lstat(alive); err != nil {
				t.Errorf("the stopped kiln's %s was removed: %v", alive, err)
			}
		})
	}
}

// signalAtCreate runs kiln with args and sends it sig the moment a file
// named prefix… appears in dir (inotify), and returns that file, which is
// still there (a run that got past it first is run again, a few times at
// most). A stopped kiln is killed when the test ends.
func signalAtCreate(t *testing.T, f *fixture, dir, prefix string, sig syscall.Signal, args ...string) string {
	t.Helper()
	for attempt := 0; attempt < 10; attempt++ {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		cmd := exec.Command(kilnBin, args...)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+f.cache)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		name := waitCreate(fd, prefix, done)
		if name != "" {
			cmd.Process.Signal(sig)
		}
		unix.Close(fd)
		if sig == syscall.SIGKILL || name == "" {
			cmd.Process.Kill()
			<-done
		} else {
			t.Cleanup(func() { cmd.Process.Kill(); <-done })
		}
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); name != "" && err == nil {
			if !strings.Contains(name, "."+strconv.Itoa(cmd.Process.Pid)+".") {
				t.Fatalf("%s does not carry its owner's tag (pid %d)", p, cmd.Process.Pid)
			}
			return p
		}
	}
	t.Fatalf("kiln %s: no %s%s… caught in 10 runs", strings.Join(args, " "), filepath.Join(dir, prefix), "")
	return ""
}

// waitCreate reads inotify events from fd until a file named prefix… is
// created (its name) or done is closed ("").
func waitCreate(fd int, prefix string, done <-chan struct{}) string {
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-done:
			return ""
		default:
		}
		if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10); err != nil && err != unix.EINTR {
			return ""
		}
		n, err := unix.Read(fd, buf)
		if err != nil {
			continue // EAGAIN: nothing yet
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if name := strings.TrimRight(string(raw), "\x00"); strings.HasPrefix(name, prefix) {
				return name
			}
		}
	}
}
