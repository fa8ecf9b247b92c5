//go:build e2e

// The QEMU scenarios build the base fixture (minutes) and boot VMs, so they
// run only with -tags e2e (make e2e), never in the unit test run.

package e2e

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/ignition/v2/config/v3_3/types"

	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/guest"
	"github.com/kiln-appliance/kiln/test/e2e/rawdisk"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

//go:embed testdata/firstboot-check.sh
var firstbootCheck string

const hello = "hello from ignition"

// TestIgnitionFirstBoot proves the base fixture behaves like CoreOS: the
// Ignition config on the boot partition is applied at first boot (a file
// written, a unit enabled and run), and a second boot does not run Ignition.
func TestIgnitionFirstBoot(t *testing.T) {
	vm.Schedule(t, 90*time.Second)
	disk := baseCopy(t)
	cfg := guest.CheckConfig(firstbootCheck)
	mode := 0o644
	cfg.Storage.Files = append(cfg.Storage.Files, types.File{
		Node:          types.Node{Path: "/etc/kiln-e2e/hello.txt"},
		FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: guest.DataURL(hello)}},
	})
	if err := guest.WriteConfig(disk, cfg); err != nil {
		t.Fatal(err)
	}

	first := vm.Boot(t, disk, vm.WithName("first-boot"))
	t.Logf("first boot (Ignition) took %s", first.Duration.Round(time.Second))
	requireAllPass(t, first)
	requireDetail(t, first, "boot", "n=1")
	requireDetail(t, first, "firstboot-flag", "yes")
	requireDetail(t, first, "ignition-finished", "yes")

	// Offline, after power-off: what Ignition wrote is on the root disk, the
	// one-shot boot entry is gone, and the journal can be read on the host.
	root := mustFind(t, disk, "root")
	got, err := root.ReadFile("/etc/kiln-e2e/hello.txt")
	if err != nil || string(got) != hello {
		t.Errorf("root:/etc/kiln-e2e/hello.txt = %q, %v; want %q", got, err, hello)
	}
	entries, err := mustFind(t, disk, "EFI-SYSTEM").FATList("/loader/entries")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(entries, "ignition-firstboot.conf") || !slices.Contains(entries, "kiln.conf") {
		t.Errorf("ESP /loader/entries after first boot = %v, want kiln.conf only", entries)
	}
	journal := readJournal(t, root, filepath.Join(filepath.Dir(first.Console), "first-boot-journal.txt"))
	if !strings.Contains(journal, "Ignition finished successfully") {
		t.Errorf("offline journal lacks %q", "Ignition finished successfully")
	}

	second := vm.Boot(t, disk, vm.WithName("second-boot"))
	t.Logf("second boot (no Ignition) took %s", second.Duration.Round(time.Second))
	requireAllPass(t, second)
	requireDetail(t, second, "boot", "n=2")
	requireDetail(t, second, "firstboot-flag", "no")
	requireDetail(t, second, "ignition-this-boot", "lines=0")
}

// TestIgnitionFailureIsReadable: a config Ignition cannot apply (a file whose
// content does not match its declared hash) must end the boot fast, with
// Ignition's own reason on the console, not after the boot timeout.
func TestIgnitionFailureIsReadable(t *testing.T) {
	vm.Schedule(t, 30*time.Second)
	disk := baseCopy(t)
	badHash := "sha512-" + strings.Repeat("0", 128)
	cfg := types.Config{
		Ignition: types.Ignition{Version: "3.3.0"},
		Storage: types.Storage{Files: []types.File{{
			Node: types.Node{Path: "/etc/kiln-e2e/corrupt.txt"},
			FileEmbedded1: types.FileEmbedded1{Contents: types.Resource{
				Source:       guest.DataURL("not what the hash says"),
				Verification: types.Verification{Hash: &badHash},
			}},
		}}},
	}
	if err := guest.WriteConfig(disk, cfg); err != nil {
		t.Fatal(err)
	}
	res, err := vm.Run(t, disk, vm.WithName("bad-config"), vm.WithTimeout(5*time.Minute))
	if res == nil {
		t.Fatal(err) // QEMU did not even start
	}
	if err == nil {
		t.Fatalf("boot with a corrupt file in the Ignition config succeeded (console: %s)", res.Console)
	}
	t.Logf("failed boot ended after %s", res.Duration.Round(time.Second))
	if !strings.Contains(err.Error(), `console showed "Ignition failed"`) {
		t.Errorf("want the boot stopped on %q, got: %v", "Ignition failed", err)
	}
	if len(res.Lines("hash verification failed")) == 0 {
		t.Errorf("console lacks Ignition's reason (hash verification failed): %s", res.Console)
	}
}

// baseCopy returns a private copy of the cached base image.
func baseCopy(t *testing.T) string {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "disk.raw")
	if err := rawdisk.Copy(disk, fixture.Base(t)); err != nil {
		t.Fatal(err)
	}
	return disk
}

func mustFind(t *testing.T, disk, name string) rawdisk.Partition {
	t.Helper()
	p, err := rawdisk.Find(disk, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readJournal copies /var/log/journal off the root partition, renders it with
// the host's journalctl and keeps the text at save.
func readJournal(t *testing.T, root rawdisk.Partition, save string) string {
	t.Helper()
	dir := t.TempDir()
	if err := root.CopyOut("/var/log/journal", dir); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("journalctl", "--directory", filepath.Join(dir, "journal"),
		"-m", "--no-pager", "-o", "short-monotonic").CombinedOutput()
	if err != nil {
		t.Fatalf("journalctl --directory: %v\n%s", err, out)
	}
	if err := os.WriteFile(save, out, 0o644); err == nil {
		t.Logf("guest journal: %s", save)
	}
	return string(out)
}

func requireAllPass(t *testing.T, r *vm.Result) {
	t.Helper()
	checks := r.Checks()
	if len(checks) == 0 {
		t.Fatalf("guest reported no %s lines; console: %s", vm.CheckPrefix, r.Console)
	}
	for _, c := range checks {
		if !c.Pass {
			t.Errorf("guest check %s FAIL %s (console: %s)", c.Name, c.Detail, r.Console)
		}
	}
}

func requireDetail(t *testing.T, r *vm.Result, name, want string) {
	t.Helper()
	c, ok := r.Check(name)
	if !ok {
		t.Errorf("guest did not report %q (console: %s)", name, r.Console)
		return
	}
	if c.Detail != want {
		t.Errorf("guest check %s: got %q, want %q (console: %s)", name, c.Detail, want, r.Console)
	}
}
