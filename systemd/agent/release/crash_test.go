package release

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"go.podman.io/storage/pkg/reexec"

	"github.com/kiln-appliance/kiln/systemd/agent/pins"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// helperEnv makes the test binary run one transition on a node tree
// instead of the tests, killing itself with SIGKILL at a named step: a
// power cut, as far as the node's files can tell.
const helperEnv = "KILN_RELEASE_TEST_HELPER"

type helperJob struct {
	Root  string
	Op    op
	DieAt string // "step name#occurrence", or "" to run to the end
}

func TestMain(m *testing.M) {
	// containers/storage applies layers in a re-executed child.
	if reexec.Init() {
		return
	}
	if job := os.Getenv(helperEnv); job != "" {
		var j helperJob
		if err := json.Unmarshal([]byte(job), &j); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		n := &node{root: j.Root}
		if _, err := n.run(nil, n.machine(j.Op.Boot, WithStepHook(occurrences(func(step string) {
			if step == j.DieAt {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}))), j.Op); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// occurrences names each step by its name and how often it was reached
// ("write pins#2"), so a step that runs twice in a transition can be told apart.
func occurrences(f func(string)) func(string) {
	seen := map[string]int{}
	return func(name string) {
		seen[name]++
		f(fmt.Sprintf("%s#%d", name, seen[name]))
	}
}

// runChild runs o on n in a child process, dying at dieAt. It reports
// whether the child was killed.
func (n *node) runChild(t *testing.T, o op, dieAt string) bool {
	t.Helper()
	job, _ := json.Marshal(helperJob{Root: n.root, Op: o, DieAt: dieAt})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(job))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	if err != nil {
		t.Fatalf("%s (die at %q): %v\n%s", o, dieAt, err, out)
	}
	return false
}

// Every transition, killed at every one of its steps, leaves a node that
// (1) still pins and stores everything its recorded releases need, (2) is
// finished by running the transition again, to exactly the node an
// uninterrupted run gives, and (3) after a reboot (the boot runs init and
// begin before CRI-O starts) is at rest in a consistent release.
func TestKilledAtEveryStep(t *testing.T) {
	t.Parallel()
	upTo12 := []op{{Action: "init"},
		{Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"}, {Action: "begin", Boot: "b1"}, {Action: "confirm", Version: "1.1.0"},
		{Action: "import", Version: "1.2.0"}, {Action: "stage", Version: "1.2.0"}, {Action: "begin", Boot: "b2"}, {Action: "confirm", Version: "1.2.0"},
		{Action: "import", Version: "1.3.0"}, {Action: "stage", Version: "1.3.0"}}
	trying13 := append(append([]op(nil), upTo12...), op{Action: "begin", Boot: "b3"})
	scenarios := []struct {
		name  string
		setup []op
		op    op
	}{
		{"init", nil, op{Action: "init"}},
		{"stage", []op{{Action: "init"}, {Action: "import", Version: "1.1.0"}}, op{Action: "stage", Version: "1.1.0"}},
		{"import", []op{{Action: "init"}}, op{Action: "import+stage", Version: "1.1.0"}},
		{"begin", []op{{Action: "init"}, {Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"}}, op{Action: "begin", Boot: "b1"}},
		{"confirm", trying13, op{Action: "confirm", Version: "1.3.0"}},
		{"rollback", trying13, op{Action: "rollback", Version: "1.3.0"}},
		{"abandon", upTo12, op{Action: "abandon", Version: "1.3.0"}},
		{"retry a release that failed", append(append([]op(nil), trying13...), op{Action: "rollback", Version: "1.3.0"}, op{Action: "import", Version: "1.3.0"}), op{Action: "retry", Version: "1.3.0"}},
		{"begin past the last attempt", append(append([]op(nil), trying13...), op{Action: "begin", Boot: "b4"}, op{Action: "begin", Boot: "b5"}), op{Action: "begin", Boot: "b6"}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			base := newNode(t)
			// The factory's pins, as Ignition writes them.
			if err := pins.Write(filepath.Join(base.root, contract.PinsDropIn), testReleases["1.0.0"].record().Images); err != nil {
				t.Fatal(err)
			}
			base.mustRun(t, sc.setup...)

			clean := base.copyTo(t)
			var steps []string
			if _, err := clean.run(t, clean.machine(sc.op.Boot, WithStepHook(occurrences(func(s string) { steps = append(steps, s) }))), sc.op); err != nil {
				t.Fatal(err)
			}
			want := clean.snapshot(t)
			if len(steps) < 3 {
				t.Fatalf("only %d steps: %v", len(steps), steps)
			}
			t.Logf("%s: %d steps: %q", sc.op, len(steps), steps)

			for _, step := range steps {
				killed := base.copyTo(t)
				if !killed.runChild(t, sc.op, step) {
					t.Errorf("%s: the run did not reach step %q", sc.op, step)
					continue
				}
				if _, err := os.Stat(filepath.Join(killed.root, contract.StateFile)); err == nil {
					killed.checkSafe(t)
				} else if sc.op.Action != "init" {
					t.Fatalf("killed at %q: the state file is gone: %v", step, err)
				}

				again := killed.copyTo(t)
				again.runChild(t, sc.op, "")
				if d := diffSnapshots(want, again.snapshot(t)); d != "" {
					t.Errorf("killed at %q, then run again: the node differs from an uninterrupted run:\n%s", step, d)
				}
				again.checkConverged(t)

				rebooted := killed.copyTo(t)
				os.RemoveAll(filepath.Join(rebooted.root, "run")) // tmpfs
				os.Remove(rebooted.crioView())                    // CRI-O has not started yet
				rebooted.runChild(t, op{Action: "init"}, "")
				rebooted.runChild(t, op{Action: "begin", Boot: "reboot"}, "")
				data, err := os.ReadFile(filepath.Join(rebooted.root, contract.PinsDropIn))
				if err != nil {
					t.Fatal(err)
				}
				os.WriteFile(rebooted.crioView(), data, 0o644) // CRI-O starts and reads its pins
				rebooted.checkConverged(t)
			}
		})
	}
}
