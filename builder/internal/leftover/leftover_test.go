package leftover

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func TestSweep(t *testing.T) {
	me, err := self()
	if err != nil {
		t.Fatal(err)
	}
	// A process that really ran and is gone, with the start time it had.
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	goneStart, err := startTime(sleeper.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	gone := me
	gone.pid, gone.start = sleeper.Process.Pid, goneStart

	reused, otherBoot, otherNS := me, me, me
	reused.start++
	otherBoot.boot = "00000000"
	if me.boot == otherBoot.boot {
		otherBoot.boot = "11111111"
	}
	otherNS.pidns += "0"
	otherNS.pid = gone.pid

	const prefix = "build-"
	for _, tc := range []struct {
		name    string
		entry   string
		removed bool
	}{
		{"alive (this process)", prefix + me.tag() + "-1", false},
		{"owner exited", prefix + gone.tag() + "-2", true},
		{"PID reused by a younger process", prefix + reused.tag() + "-3", true},
		{"machine rebooted since", prefix + otherBoot.tag() + "-4", true},
		{"other PID namespace", prefix + otherNS.tag() + "-5", false},
		{"no tag (older kiln)", prefix + "123456789", false},
		{"malformed tag", prefix + "x.y.z.w-6", false},
		{"tag without the random part", prefix + gone.tag(), false},
		{"other prefix", "cache-" + gone.tag() + "-7", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, tc.entry)
			if err := os.MkdirAll(filepath.Join(p, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(p, "sub", "f"), []byte("x"), 0o644)
			removed, err := Sweep(dir, prefix)
			if err != nil {
				t.Fatal(err)
			}
			_, statErr := os.Lstat(p)
			if gone := os.IsNotExist(statErr); gone != tc.removed {
				t.Errorf("%s: removed = %v, want %v", tc.entry, gone, tc.removed)
			}
			if tc.removed != (len(removed) == 1) {
				t.Errorf("Sweep reported %v", removed)
			}
		})
	}
}

// TestPattern: names made with Pattern are this process's, so never swept
// while it runs, and carry the tag Sweep reads.
func TestPattern(t *testing.T) {
	dir := t.TempDir()
	var made []string
	for range 3 {
		f, err := os.CreateTemp(dir, Pattern(".out.raw.kiln-tmp-"))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		made = append(made, f.Name())
	}
	if removed, err := Sweep(dir, ".out.raw.kiln-tmp-"); err != nil || len(removed) != 0 {
		t.Fatalf("Sweep removed a live process's files: %v, %v", removed, err)
	}
	me, _ := self()
	sort.Strings(made)
	for _, m := range made {
		if !strings.HasPrefix(filepath.Base(m), ".out.raw.kiln-tmp-"+me.tag()+"-") {
			t.Errorf("%s does not carry this process's tag %s", m, me.tag())
		}
	}
}

// TestSweepMounts: mounts under a dead build's entry are unmounted before
// anything is removed, so what a bind mount shows survives; a mount that
// cannot be unmounted (busy) keeps the entry, and the error says what to do.
func TestSweepMounts(t *testing.T) {
	me, _ := self()
	dead := me
	dead.boot = "00000000"
	if me.boot == dead.boot {
		dead.boot = "11111111"
	}
	for _, busy := range []bool{false, true} {
		t.Run(map[bool]string{false: "bind mount", true: "busy mount"}[busy], func(t *testing.T) {
			dir := t.TempDir()
			precious := filepath.Join(t.TempDir(), "precious")
			os.WriteFile(precious, []byte("x"), 0o644)
			p := filepath.Join(dir, "build-"+dead.tag()+"-1")
			mnt := filepath.Join(p, "storage", "overlay", "merged")
			if err := os.MkdirAll(mnt, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("mount", "--bind", filepath.Dir(precious), mnt).CombinedOutput(); err != nil {
				t.Fatalf("bind mount (the tests run as root): %v\n%s", err, out)
			}
			t.Cleanup(func() { exec.Command("umount", mnt).Run() })
			if busy {
				cwd, _ := os.Getwd()
				if err := os.Chdir(mnt); err != nil { // a busy mount: this process's cwd
					t.Fatal(err)
				}
				defer os.Chdir(cwd)
			}

			removed, err := Sweep(dir, "build-")
			if _, statErr := os.Stat(precious); statErr != nil {
				t.Fatalf("a file seen through the mount was removed: %v", statErr)
			}
			_, pErr := os.Lstat(p)
			if busy {
				if err == nil || !strings.Contains(err.Error(), "unmount "+mnt) || len(removed) != 0 || pErr != nil {
					t.Errorf("busy mount: Sweep = %v, %v; entry err %v; want the entry kept and an error naming the mount", removed, err, pErr)
				}
				return
			}
			if err != nil || len(removed) != 1 || !os.IsNotExist(pErr) {
				t.Errorf("Sweep = %v, %v; entry err %v; want it unmounted and removed", removed, err, pErr)
			}
		})
	}
}
