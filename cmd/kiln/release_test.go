package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/systemd/agent/release"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// agentCmd runs the node's edition (kiln-agent) with env added; it returns
// the output and the exit code.
func agentCmd(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(filepath.Dir(kilnBin), "kiln-agent"), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// A factory node as the node edition sees it: status before anything is
// recorded, begin at boot records the factory release and pins it, status
// -o json for monitoring, refusals with their exit codes, and CRI-O told
// through systemctl.
func TestAgentReleaseAndStatus(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	part := filepath.Join(root, contract.MountPoint)
	if err := os.MkdirAll(part, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &contract.Contents{SchemaVersion: contract.ContentsVersion, Version: "1.0.0",
		Images: []contract.Image{{Name: "quay.io/acme/app:1.0", Digest: "sha256:" + strings.Repeat("a", 64)}}}
	if err := stage.WriteContents(part, c); err != nil {
		t.Fatal(err)
	}
	r := "--root=" + root

	out, code := agentCmd(t, nil, "agent", "status", r)
	if code != 0 || !strings.Contains(out, "1.0.0") || !strings.Contains(out, "no state recorded yet") || !strings.Contains(out, "recorded at the next boot") {
		t.Errorf("status before begin: exit %d\n%s", code, out)
	}

	if out, code := agentCmd(t, nil, "agent", "release", "begin", r, "--apply-pins=none"); code != 0 {
		t.Fatalf("begin: exit %d\n%s", code, out)
	}
	out, code = agentCmd(t, nil, "agent", "status", r, "-o", "json")
	var st release.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("status -o json: exit %d, %v\n%s", code, err, out)
	}
	if !st.Recorded || st.Current.Version != "1.0.0" || !st.PinsCurrent || len(st.Pins) != 2 || st.Previous != nil {
		t.Errorf("status after begin: %+v", st)
	}
	out, code = agentCmd(t, nil, "agent", "status", r)
	for _, want := range []string{"current:  1.0.0  (1 image(s), 0 file(s))", "previous: -", "pins:     2 in " + contract.PinsDropIn + ", as the state says", "quay.io/acme/app:1.0"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status: exit %d, want %q in\n%s", code, want, out)
		}
	}

	if out, code := agentCmd(t, nil, "agent", "release", "confirm", "1.1.0", r, "--apply-pins=none"); code != 1 || !strings.Contains(out, "no such release") {
		t.Errorf("confirm of nothing: exit %d\n%s", code, out)
	}
	if out, code := agentCmd(t, nil, "agent", "release", "converge", r, "--apply-pins=sighup"); code != 2 || !strings.Contains(out, "want reload, restart or none") {
		t.Errorf("bad --apply-pins: exit %d\n%s", code, out)
	}
	if out, code := agentCmd(t, nil, "agent", "status", r, "-o", "yaml"); code != 2 {
		t.Errorf("bad --output: exit %d\n%s", code, out)
	}

	// CRI-O is told through systemctl (a stand-in on PATH that logs its
	// arguments, or fails): after a reboot (/run is empty) converge tells it
	// once; when systemctl fails, converge fails saying so and tries again
	// next time.
	bin := t.TempDir()
	log := filepath.Join(bin, "log")
	script := "#!/bin/sh\necho \"$@\" >> " + log + "\n[ -e " + filepath.Join(bin, "fail") + " ] && { echo 'Job for crio.service failed' >&2; exit 1; }\nexit 0\n"
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	path := []string{"PATH=" + bin + ":" + os.Getenv("PATH")}
	os.RemoveAll(filepath.Join(root, "run"))
	os.WriteFile(filepath.Join(bin, "fail"), nil, 0o644)
	if out, code := agentCmd(t, path, "agent", "release", "converge", r, "--apply-pins=restart"); code != 1 || !strings.Contains(out, "CRI-O was not told") || !strings.Contains(out, "Job for crio.service failed") {
		t.Errorf("converge with a failing systemctl: exit %d\n%s", code, out)
	}
	os.Remove(filepath.Join(bin, "fail"))
	for _, apply := range []string{"restart", "reload", "reload"} {
		if out, code := agentCmd(t, path, "agent", "release", "converge", r, "--apply-pins="+apply); code != 0 {
			t.Fatalf("converge: exit %d\n%s", code, out)
		}
	}
	if got, _ := os.ReadFile(log); string(got) != "try-restart crio.service\ntry-restart crio.service\n" {
		t.Errorf("systemctl was run with:\n%s", got)
	}
}

// The status keeps showing the releases that failed since the last
// confirm, one line each, whatever the last transition was.
func TestPrintStatusFailed(t *testing.T) {
	t.Parallel()
	health := state.Result{Action: "rollback", Version: "1.1.0", Message: "health check: app.service is not active", Time: 1800000000}
	boots := state.Result{Action: "rollback", Version: "1.2.0", Message: "release 1.2.0 never reached boot-complete", Time: 1800003600}
	staged := &contract.Release{Version: "1.1.0"}
	for _, tc := range []struct {
		name   string
		status release.Status
		want   []string // the lines from last: on, up to pins:
	}{
		{"nothing failed", release.Status{Last: &state.Result{Action: "confirm", Version: "1.1.0", OK: true, Time: 1800000000}},
			[]string{"last:     confirm 1.1.0 ok (2027-01-15T08:00:00Z)"}},
		{"just rolled back", release.Status{Last: &health, Failed: []state.Result{health}},
			[]string{"last:     rollback 1.1.0 FAILED: health check: app.service is not active (2027-01-15T08:00:00Z)",
				"failed:   1.1.0 rolled back at 2027-01-15T08:00:00Z: health check: app.service is not active"}},
		{"staged again", release.Status{Staged: staged, Last: &state.Result{Action: "stage", Version: "1.1.0", OK: true, Time: 1800001800}, Failed: []state.Result{health}},
			[]string{"last:     stage 1.1.0 ok (2027-01-15T08:30:00Z)",
				"failed:   1.1.0 rolled back at 2027-01-15T08:00:00Z: health check: app.service is not active"}},
		{"two failed", release.Status{Last: &boots, Failed: []state.Result{health, boots}},
			[]string{"last:     rollback 1.2.0 FAILED: release 1.2.0 never reached boot-complete (2027-01-15T09:00:00Z)",
				"failed:   1.1.0 rolled back at 2027-01-15T08:00:00Z: health check: app.service is not active",
				"failed:   1.2.0 rolled back at 2027-01-15T09:00:00Z: release 1.2.0 never reached boot-complete"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.status
			st.Recorded, st.PinsCurrent, st.Current = true, true, contract.Release{Version: "1.0.0"}
			var b strings.Builder
			printStatus(&b, nodeStatus{Status: &st, ImagesError: "not looked at"})
			out := b.String()
			from, to := strings.Index(out, "last:"), strings.Index(out, "pins:")
			if from < 0 || to < from {
				t.Fatalf("no last: before pins: in\n%s", out)
			}
			if got, want := strings.Split(strings.TrimSuffix(out[from:to], "\n"), "\n"), tc.want; !slices.Equal(got, want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
