package vm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMonitorPlugsDisk drives a real QEMU (q35, stopped before the first
// instruction: no guest needed) through the monitor: a disk plugged into a
// hot-plug port shows up read-only in QEMU's block list, a second one takes
// the next port, an unknown device is an error that names it, reset answers.
func TestMonitorPlugsDisk(t *testing.T) {
	m, _, _ := stoppedWithSticks(t)
	if m.ports["stick-a"] == m.ports["stick-b"] {
		t.Errorf("two disks on one port: %v", m.ports)
	}
	out, err := m.Execute("query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"node-name": "stick-a"`, `"node-name": "stick-b"`, `"ro": true`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("query-named-block-nodes lacks %s: %s", want, out)
		}
	}
	if err := m.UnplugDisk("no-such"); err == nil || !strings.Contains(err.Error(), "no-such") {
		t.Errorf("unplug of an unknown disk: %v", err)
	}
	if err := m.Reset(); err != nil {
		t.Error(err)
	}
}

// startStopped starts a q35 QEMU stopped before its first instruction, with
// a QMP socket and the hot-plug ports, that exits on a reset (-no-reboot,
// as Boot runs it).
func startStopped(t *testing.T, sock string) *exec.Cmd {
	t.Helper()
	os.Remove(sock)
	args := append([]string{"-accel", "tcg", "-machine", "q35", "-S", "-nodefaults", "-display", "none", "-no-reboot",
		"-qmp", "unix:" + sock + ",server=on,wait=off"}, hotplugArgs()...)
	cmd := exec.Command("qemu-system-x86_64", args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu-system-x86_64 (is qemu-system-x86 installed?): %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// stoppedWithSticks starts a stopped QEMU (startStopped), connects a
// Monitor and plugs two sticks of one image file in, stick-a and stick-b.
func stoppedWithSticks(t *testing.T) (*Monitor, *exec.Cmd, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	stick := filepath.Join(dir, "stick.img")
	if err := os.WriteFile(stick, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := startStopped(t, sock)
	m, err := dialMonitor(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.close() })
	for _, id := range []string{"stick-a", "stick-b"} {
		if err := m.PlugDisk(id, stick); err != nil {
			t.Fatal(err)
		}
	}
	return m, cmd, sock
}

// TestMonitorResetStartsAgain: a reset ends the QEMU process (-no-reboot)
// and the monitor says it was a reset; the next QEMU gets the same Monitor,
// and the stick that was in at the reset is plugged in again at the same
// port; a stick pulled out before the reset stays out. A power-off is not
// a reset.
func TestMonitorResetStartsAgain(t *testing.T) {
	m, first, sock := stoppedWithSticks(t)
	port := m.ports["stick-b"]
	// Pulled out while stopped: QEMU removes the device at once only for a
	// running guest, so forget it the way UnplugDisk does after the event.
	delete(m.ports, "stick-a")
	delete(m.files, "stick-a")
	if err := m.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("QEMU after the reset: %v", err)
	}
	if r := m.exitReason(); r != "host-qmp-system-reset" {
		t.Fatalf("exit reason %q, want host-qmp-system-reset", r)
	}

	second := startStopped(t, sock)
	if err := m.attach(sock); err != nil {
		t.Fatal(err)
	}
	if err := m.replug(); err != nil {
		t.Fatal(err)
	}
	out, err := m.Execute("query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"node-name": "stick-b"`) || strings.Contains(string(out), `"node-name": "stick-a"`) {
		t.Errorf("after the reset, want stick-b plugged and stick-a out: %s", out)
	}
	if m.ports["stick-b"] != port {
		t.Errorf("stick-b at %s after the reset, was at %s", m.ports["stick-b"], port)
	}
	if _, err := m.Execute("quit", nil); err != nil && !errors.Is(err, errMonitorClosed) {
		t.Fatal(err)
	}
	second.Wait()
	if r := m.exitReason(); r == "guest-reset" || r == "host-qmp-system-reset" {
		t.Errorf("a quit reads as a reset: %q", r)
	}
}
