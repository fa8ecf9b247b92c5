package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// The image partition's agent (the node edition, at its node path under a
// test's root) hands off to the agent the booted entry names (kiln.agent=
// on the kernel command line), from the release store, checked as it is
// copied; with none named, or run from anywhere else, it runs itself; a
// named agent that is missing or damaged runs nothing.
func TestAgentHandoff(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	agent := filepath.Join(root, contract.AgentPath)
	os.MkdirAll(filepath.Dir(agent), 0o755)
	bin, err := os.ReadFile(filepath.Join(filepath.Dir(kilnBin), "kiln-agent"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(agent, bin, 0o755)
	release := []byte("#!/bin/sh\necho \"the release's agent: $* ($KILN_AGENT_HANDOFF)\"\n")
	d := fmt.Sprintf("sha256:%x", sha256.Sum256(release))
	blob := filepath.Join(root, contract.ReleaseStore, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
	os.MkdirAll(filepath.Dir(blob), 0o755)
	os.MkdirAll(filepath.Join(root, "proc"), 0o755)
	self := "no release state recorded: no release is being tried"

	for _, tc := range []struct {
		name, cmdline, blob string
		bin                 string // default: the image partition's agent
		want                string
		code                int
	}{
		{"no parameter: the partition's agent", "root=LABEL=root rw", string(release), "", self, 1},
		{"the release's agent", "root=LABEL=root kiln.agent=" + d + " rw", string(release), "",
			fmt.Sprintf("the release's agent: agent release trying --root %s (%s)", root, d), 0},
		{"not the image partition's agent: runs itself", "kiln.agent=" + d, string(release), filepath.Join(filepath.Dir(kilnBin), "kiln-agent"), self, 1},
		{"damaged in the store", "kiln.agent=" + d, "#!/bin/sh\necho tampered\n", "",
			"kiln: this boot's entry runs kiln agent " + d + " (kiln.agent=): damaged: " + blob + " hashes to sha256:", 1},
		{"missing from the store", "kiln.agent=" + d, "", "", "the release store lacks it: the boot loader goes back to the release before once this entry's tries run out", 1},
		{"not a digest", "kiln.agent=latest", string(release), "", `the kernel command line's kiln.agent="latest" is not sha256:HEX`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.WriteFile(filepath.Join(root, "proc", "cmdline"), []byte(tc.cmdline+"\n"), 0o644)
			os.Remove(blob)
			if tc.blob != "" {
				os.WriteFile(blob, []byte(tc.blob), 0o644)
			}
			bin := tc.bin
			if bin == "" {
				bin = agent
			}
			out, err := exec.Command(bin, "agent", "release", "trying", "--root", root).CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !strings.Contains(string(out), tc.want) {
				t.Errorf("exit %d, want %d; output:\n%s\nwant %q", code, tc.code, out, tc.want)
			}
		})
	}
}
