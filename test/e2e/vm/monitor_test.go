package vm

import (
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
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	stick := filepath.Join(dir, "stick.img")
	if err := os.WriteFile(stick, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-accel", "tcg", "-machine", "q35", "-S", "-nodefaults", "-display", "none",
		"-qmp", "unix:" + sock + ",server=on,wait=off"}, hotplugArgs()...)
	cmd := exec.Command("qemu-system-x86_64", args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu-system-x86_64 (is qemu-system-x86 installed?): %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	m, err := dialMonitor(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()

	for _, id := range []string{"stick-a", "stick-b"} {
		if err := m.PlugDisk(id, stick); err != nil {
			t.Fatal(err)
		}
	}
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
