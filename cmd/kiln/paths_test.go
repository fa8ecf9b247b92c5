package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// TestFIFOInputs (issue 26, item 7): a FIFO given as any input, or inside
// an OCI layout, is refused at once with what it is. Before, kiln opened it
// with a plain open, which waits for a writer inside the system call, where
// neither Ctrl-C nor SIGTERM reaches: each of these hung for good.
func TestFIFOInputs(t *testing.T) {
	makeInputs(t)
	const fifoMsg = "is a FIFO (named pipe), not a regular file"
	for _, tc := range []struct {
		name string
		// setup makes the FIFO in the fixture and returns kiln's arguments.
		setup func(t *testing.T, f *fixture, mkfifo func(string) string) []string
		want  []string
	}{
		{"verify a FIFO", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			return []string{"verify", mkfifo("disk.raw")}
		}, []string{fifoMsg}},
		{"inspect a FIFO", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			return []string{"inspect", mkfifo("disk.raw")}
		}, []string{fifoMsg}},
		{"build a FIFO recipe", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			return []string{"build", mkfifo("r.yaml"), "-o", filepath.Join(f.dir, "out.raw")}
		}, []string{"read recipe", fifoMsg}},
		{"lock a FIFO recipe", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			return []string{"lock", mkfifo("r.yaml")}
		}, []string{"read recipe", fifoMsg}},
		{"build with a FIFO lock", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			mkfifo(filepath.Base(recipes.LockPath(f.recipe)))
			return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw")}
		}, []string{"read lock file", fifoMsg}},
		{"build with a FIFO base", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			replaceInFile(t, f.recipe, filepath.Join(inputs.dir, "base.raw"), mkfifo("base.raw"))
			return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw")}
		}, []string{"appliance.yaml:7:9: base.path:", "is not a regular file"}},
		{"build with a FIFO index.json in a layout", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			fifoInLayout(t, f, "index.json", mkfifo)
			return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw")}
		}, []string{"appliance.yaml:12:13: images[0].source:", "oci/index.json " + fifoMsg}},
		{"lock with a FIFO index.json in a layout", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			fifoInLayout(t, f, "index.json", mkfifo)
			return []string{"lock", f.recipe}
		}, []string{"oci/index.json " + fifoMsg}},
		{"build with a FIFO oci-layout in a layout", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			fifoInLayout(t, f, "oci-layout", mkfifo)
			return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw")}
		}, []string{"appliance.yaml:12:13: images[0].source:", "oci/oci-layout " + fifoMsg}},
		{"serve a layout with a FIFO oci-layout", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			fifoInLayout(t, f, "oci-layout", mkfifo)
			return []string{"serve", "--listen", "127.0.0.1:15050", filepath.Join(f.dir, "oci")}
		}, []string{"oci-layout", "not a regular file"}},
		{"build with a FIFO agent", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			return []string{"build", f.recipe, "-o", filepath.Join(f.dir, "out.raw"), "--agent", mkfifo("kiln-agent")}
		}, []string{"agent binary", fifoMsg}},
		{"bundle with a FIFO signing key", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			return []string{"bundle", f.recipe, "-o", filepath.Join(f.dir, "up.img"), "--key", mkfifo("k.key")}
		}, []string{"signing key", fifoMsg}},
		{"import a FIFO", func(t *testing.T, f *fixture, mkfifo func(string) string) []string {
			return []string{"agent", "import", "--root", t.TempDir(), mkfifo("bundle.img")}
		}, []string{fifoMsg}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "base.raw", "fit", "false")
			mkfifo := func(name string) string {
				p := filepath.Join(f.dir, name)
				if err := syscall.Mkfifo(p, 0o644); err != nil {
					t.Fatal(err)
				}
				return p
			}
			args := tc.setup(t, f, mkfifo)
			// A run that hangs is killed (and fails the test) after a minute.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, kilnBin, args...)
			cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+f.cache)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("kiln %s hung on the FIFO\n%s", strings.Join(args, " "), out)
			}
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Fatalf("kiln %s: exit %d (%v), want 1\n%s", strings.Join(args, " "), code, err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("message lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// fifoInLayout gives the fixture a copy of the shared layout whose file
// name is a FIFO, as the first image's source.
func fifoInLayout(t *testing.T, f *fixture, name string, mkfifo func(string) string) {
	t.Helper()
	run(t, "cp", "-r", filepath.Join(inputs.dir, "oci"), filepath.Join(f.dir, "oci"))
	if err := os.Remove(filepath.Join(f.dir, "oci", name)); err != nil {
		t.Fatal(err)
	}
	mkfifo(filepath.Join("oci", name))
	replaceInFile(t, f.recipe, inputs.dir+"/oci:quay.io/acme/app:1.2", f.dir+"/oci:quay.io/acme/app:1.2")
}

// TestOutputIsAnInput (issue 26, item 5): an output that is one of the
// run's own inputs, by name, symlink or hard link, is refused before any
// work, naming the input, which stays as it was. Before, the finished disk
// was renamed over it.
func TestOutputIsAnInput(t *testing.T) {
	makeInputs(t)
	for _, tc := range []struct {
		name string
		// setup returns kiln's arguments and the input that must survive.
		setup func(t *testing.T, f *fixture) (args []string, input string)
		want  string
	}{
		{"build -o the recipe", func(t *testing.T, f *fixture) ([]string, string) {
			return []string{"build", f.recipe, "-o", f.recipe}, f.recipe
		}, "is the recipe"},
		{"build -o the lock", func(t *testing.T, f *fixture) ([]string, string) {
			mustKiln(t, f, "lock", f.recipe)
			lock := recipes.LockPath(f.recipe)
			return []string{"build", f.recipe, "-o", lock}, lock
		}, "is the recipe's lock file"},
		{"build -o the lock it is about to write", func(t *testing.T, f *fixture) ([]string, string) {
			return []string{"build", f.recipe, "-o", recipes.LockPath(f.recipe)}, ""
		}, "is the recipe's lock file"},
		{"build -o a hard link to the base", func(t *testing.T, f *fixture) ([]string, string) {
			base := privateBase(t, f)
			link := filepath.Join(f.dir, "disk.raw")
			if err := os.Link(base, link); err != nil {
				t.Fatal(err)
			}
			return []string{"build", f.recipe, "-o", link}, base
		}, "is the base image the recipe names (base.path)"},
		{"build -o a symlink to the base", func(t *testing.T, f *fixture) ([]string, string) {
			base := privateBase(t, f)
			link := filepath.Join(f.dir, "disk.raw")
			if err := os.Symlink(base, link); err != nil {
				t.Fatal(err)
			}
			return []string{"build", f.recipe, "-o", link}, base
		}, "is the base image the recipe names (base.path)"},
		{"build -o the agent", func(t *testing.T, f *fixture) ([]string, string) {
			agent := filepath.Join(f.dir, "kiln-agent")
			run(t, "cp", filepath.Join(filepath.Dir(kilnBin), "kiln-agent"), agent)
			return []string{"build", f.recipe, "-o", agent, "--agent", agent}, agent
		}, "is the agent binary"},
		{"reflash-stick -o the base", func(t *testing.T, f *fixture) ([]string, string) {
			base := privateBase(t, f)
			return []string{"reflash-stick", f.recipe, "-o", base}, base
		}, "is the base image the recipe names (base.path)"},
		{"reflash-stick -o its --disk", func(t *testing.T, f *fixture) ([]string, string) {
			disk := filepath.Join(f.dir, "disk.raw")
			if err := os.WriteFile(disk, []byte("a disk"), 0o644); err != nil {
				t.Fatal(err)
			}
			return []string{"reflash-stick", f.recipe, "--disk", disk, "-o", disk}, disk
		}, "is the appliance disk (--disk)"},
		{"bundle -o its signing key", func(t *testing.T, f *fixture) ([]string, string) {
			key := trustingRecipe(t, f)
			mustKiln(t, f, "lock", f.recipe)
			return []string{"bundle", f.recipe, "--key", key, "-o", key}, key
		}, "is the signing key (--key)"},
		{"bundle -o its --from", func(t *testing.T, f *fixture) ([]string, string) {
			key := trustingRecipe(t, f)
			mustKiln(t, f, "lock", f.recipe)
			from := filepath.Join(f.dir, "old.lock")
			run(t, "cp", recipes.LockPath(f.recipe), from)
			return []string{"bundle", f.recipe, "--key", key, "--from", from, "-o", from}, from
		}, "is a release given with --from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "base.raw", "fit", "false")
			args, input := tc.setup(t, f)
			var before string
			if input != "" {
				before = sha256File(t, input)
			}
			msg, code := kiln(t, f, args...)
			if code != 1 || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "give -o another file") {
				t.Fatalf("kiln %s: exit %d, want 1 saying %q:\n%s", strings.Join(args, " "), code, tc.want, msg)
			}
			if input != "" && sha256File(t, input) != before {
				t.Errorf("%s changed", input)
			}
			if tmps, _ := filepath.Glob(filepath.Join(f.dir, ".*kiln-tmp-*")); len(tmps) > 0 {
				t.Errorf("temp files left: %v", tmps)
			}
			if ents, _ := os.ReadDir(filepath.Join(f.cache, "kiln")); len(ents) > 0 {
				t.Errorf("work was done before the refusal: the cache holds %d entries", len(ents))
			}
		})
	}
}

// privateBase gives the fixture a copy of the base disk and returns it.
func privateBase(t *testing.T, f *fixture) string {
	t.Helper()
	base := filepath.Join(f.dir, "base.raw")
	run(t, "cp", "--sparse=always", filepath.Join(inputs.dir, "base.raw"), base)
	replaceInFile(t, f.recipe, filepath.Join(inputs.dir, "base.raw"), base)
	return base
}

// trustingRecipe makes the fixture's recipe trust a new key, for bundles,
// and returns the private key's path.
func trustingRecipe(t *testing.T, f *fixture) string {
	t.Helper()
	cmd := exec.Command(kilnBin, "key", "generate", "factory")
	cmd.Dir = f.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kiln key generate: %v\n%s", err, out)
	}
	appendFile(t, f.recipe, "trust: [factory.pub]\n")
	return filepath.Join(f.dir, "factory.key")
}
