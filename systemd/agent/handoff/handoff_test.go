package handoff

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// helperEnv makes the test binary, run again by a test, call Run or Exec
// (which replace the process) and print what they returned.
const helperEnv = "KILN_HANDOFF_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "run":
		fmt.Printf("Run returned %v\n", Run(os.Args))
		os.Exit(0)
	case "exec":
		// os.Args: the test binary, ROOT, DIGEST, then the arguments.
		fmt.Printf("Exec returned %v\n", Exec(os.Args[1], os.Args[2], os.Args[3:]))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var (
	d1 = "sha256:" + strings.Repeat("a", 64)
	d2 = "sha256:" + strings.Repeat("b", 64)
)

func TestTarget(t *testing.T) {
	for _, tc := range []struct {
		name, cmdline, want, err string
	}{
		{name: "none", cmdline: "root=LABEL=root rw quiet"},
		{name: "empty", cmdline: ""},
		{name: "one", cmdline: "root=LABEL=root " + contract.AgentOption(d1) + " rw", want: d1},
		{name: "the last wins", cmdline: contract.AgentOption(d1) + " " + contract.AgentOption(d2) + "\n", want: d2},
		{name: "a longer name is not it", cmdline: "kiln.agentx=" + d1},
		{name: "not a digest", cmdline: "kiln.agent=latest", err: `the kernel command line's kiln.agent="latest" is not sha256:HEX`},
		{name: "upper case hex", cmdline: "kiln.agent=sha256:" + strings.Repeat("A", 64), err: "is not sha256:HEX"},
		{name: "short", cmdline: "kiln.agent=sha256:abc", err: "is not sha256:HEX"},
		{name: "another algorithm", cmdline: "kiln.agent=sha512:" + strings.Repeat("a", 64), err: "is not sha256:HEX"},
		{name: "a bad one overridden", cmdline: "kiln.agent=latest " + contract.AgentOption(d1), want: d1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Target(tc.cmdline)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Target(%q) = %q, %v; want an error containing %q", tc.cmdline, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Target(%q) = %q, %v; want %q", tc.cmdline, got, err, tc.want)
			}
		})
	}
}

func TestRootArg(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"kiln", "agent", "release", "trying"}, "/"},
		{[]string{"kiln", "agent", "--root", "/tmp/node", "release"}, "/tmp/node"},
		{[]string{"kiln", "agent", "--root=/tmp/node"}, "/tmp/node"},
		{[]string{"kiln", "agent", "--root"}, "/"}, // no value: cobra says so later
	} {
		if got := rootArg(tc.args); got != tc.want {
			t.Errorf("rootArg(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// node is a test's node tree: the release store holding blob, /proc/cmdline.
func node(t *testing.T, cmdline string, blob []byte) (root, digest, blobPath string) {
	t.Helper()
	root = t.TempDir()
	digest = fmt.Sprintf("sha256:%x", sha256.Sum256(blob))
	blobPath = filepath.Join(root, contract.ReleaseStore, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
	for p, b := range map[string][]byte{blobPath: blob, filepath.Join(root, "proc", "cmdline"): []byte(cmdline + "\n")} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root, digest, blobPath
}

// The release's agent a test hands off to: it says what it was run with.
var script = []byte("#!/bin/sh\necho \"handed off: $* ($" + Env + ")\"\n")

func helper(t *testing.T, bin, mode string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, args, err, out)
	}
	return string(out)
}

func TestExec(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("runs the blob, checked, with the arguments and the digest in its environment", func(t *testing.T) {
		root, d, _ := node(t, "", script)
		out := helper(t, self, "exec", root, d, "kiln-agent", "agent", "release", "trying")
		if want := fmt.Sprintf("handed off: agent release trying (%s)\n", d); out != want {
			t.Fatalf("the handed-off agent said %q, want %q", out, want)
		}
	})
	// The refusals run in a child too: an Exec that wrongly ran the blob
	// would replace the test itself.
	t.Run("damaged", func(t *testing.T) {
		root, d, blob := node(t, "", script)
		os.WriteFile(blob, []byte("#!/bin/sh\necho tampered\n"), 0o755)
		out := helper(t, self, "exec", root, d, "kiln")
		if want := "Exec returned this boot's entry runs kiln agent " + d + " (kiln.agent=): damaged: " + blob + " hashes to sha256:"; !strings.HasPrefix(out, want) {
			t.Fatalf("Exec of a damaged blob: %q, want %q...", out, want)
		}
		if err := Exec(root, d, []string{"kiln"}); !errors.Is(err, contract.ErrDamaged) {
			t.Fatalf("Exec of a damaged blob = %v, want contract.ErrDamaged", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		root, d, blob := node(t, "", script)
		os.Remove(blob)
		out := helper(t, self, "exec", root, d, "kiln")
		if !strings.HasPrefix(out, "Exec returned this boot's entry runs kiln agent "+d+" (kiln.agent=): open "+blob) ||
			!strings.Contains(out, "the release store lacks it") {
			t.Fatalf("Exec of a missing blob: %q", out)
		}
	})
}

// Run hands off only from the image partition's agent, only when the entry
// names an agent, and never twice.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name, cmdline string
		elsewhere     bool // the binary is not the image partition's agent
		env           bool // already handed off
		want          string
	}{
		{name: "named: hands off", cmdline: "root=LABEL=root {opt} rw", want: "handed off: --root {root} (%s)\n"},
		{name: "none named: runs itself", cmdline: "root=LABEL=root rw", want: "Run returned <nil>\n"},
		{name: "not a digest: refuses", cmdline: "kiln.agent=latest", want: `Run returned the kernel command line's kiln.agent="latest" is not sha256:HEX` + "\n"},
		{name: "not the image partition's agent: runs itself", cmdline: "{opt}", elsewhere: true, want: "Run returned <nil>\n"},
		{name: "handed off already: runs itself", cmdline: "{opt}", env: true, want: "Run returned <nil>\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, d, _ := node(t, "", script)
			os.WriteFile(filepath.Join(root, "proc", "cmdline"), []byte(strings.ReplaceAll(tc.cmdline, "{opt}", contract.AgentOption(d))), 0o644)
			self, err := os.ReadFile(os.Args[0])
			if err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(root, contract.AgentPath)
			if tc.elsewhere {
				bin = filepath.Join(root, "usr/bin/kiln")
			}
			os.MkdirAll(filepath.Dir(bin), 0o755)
			if err := os.WriteFile(bin, self, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.env {
				t.Setenv(Env, d)
			} else {
				os.Unsetenv(Env)
			}
			out := helper(t, bin, "run", "--root", root)
			want := strings.ReplaceAll(tc.want, "{root}", root)
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, d)
			}
			if out != want {
				t.Fatalf("got %q, want %q", out, want)
			}
		})
	}
}
