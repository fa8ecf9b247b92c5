//go:build e2e

package e2e

import (
	_ "embed"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/partitions/esp"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

//go:embed testdata/secureboot-check.sh
var secureBootCheck string

// TestSecureBoot boots a disk kiln built with the recipe's secureBoot on
// OVMF's Secure Boot firmware, its variables in setup mode as a new machine's:
// systemd-boot enrols the factory's keys from loader/keys/auto and resets the
// machine; the firmware then checks the signed systemd-boot, which starts the
// signed first-boot UKI; Secure Boot is on, the kernel holds db, and dm-verity
// opens /usr and the image partition with the root hashes of the signed
// command line, which `kiln verify` proved to be the partitions' own. The
// appliance runs as it does without (Ignition, registry, workload).
func TestSecureBoot(t *testing.T) {
	vm.Schedule(t, 8*time.Minute)
	a := buildAppliance(t, withLib(secureBootCheck), withSecureBoot())
	if out, err := exec.Command(a.kiln, "verify", a.disk).CombinedOutput(); err != nil {
		t.Fatalf("kiln verify of the built disk: %v\n%s", err, out)
	}
	espPart := mustFind(t, a.disk, "EFI-SYSTEM")
	firstBoot := filepath.Join(t.TempDir(), "ignition-firstboot.efi")
	if err := (esp.FS{Disk: a.disk, Offset: espPart.Offset}).CopyOut("EFI/Linux/ignition-firstboot.efi", firstBoot); err != nil {
		t.Fatal(err)
	}
	sec, err := uki.Read(firstBoot)
	if err != nil {
		t.Fatal(err)
	}
	images, ok := sec.Param("kiln.images.roothash")
	if !ok {
		t.Fatalf("the first-boot UKI's command line names no image partition root hash: %s", sec.Cmdline)
	}

	res := vm.Boot(t, a.disk, vm.WithName("secure-boot"), vm.WithSecureBoot(), vm.WithReboots(),
		vm.WithTimeout(applianceTimeout(20*time.Minute)))
	enrol, ok := res.When("Enrolling secure boot keys from directory: \\loader\\keys\\auto")
	if !ok {
		t.Errorf("systemd-boot did not enrol the keys from loader/keys/auto (console: %s)", res.Console)
	}
	if boot, ok := res.When("KILN-E2E: secure-boot "); !ok || boot < enrol {
		t.Errorf("no Secure Boot check after the enrolment (console: %s)", res.Console)
	}
	requireAllPass(t, res)
	requireDetail(t, res, "secure-boot", "enabled")
	requireDetail(t, res, "booted-entry", "ignition-firstboot.efi")
	requireDetail(t, res, "images-roothash", images)
	for _, name := range []string{"kernel-secure-boot", "db-in-kernel", "stub", "ignition", "usr-roothash", "mount-verity",
		"workload-up", "failed-units"} {
		requirePass(t, res, name)
	}
}
