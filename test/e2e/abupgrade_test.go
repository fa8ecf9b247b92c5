//go:build e2e

package e2e

// The whole appliance upgraded from a stick (issue 23): a factory disk built
// by kiln on the A/B base, whose OS is in slot a, takes a release whose OS
// differs, boots it from slot b with the entry the node wrote, and falls
// back by itself from a release whose initramfs cannot boot.

import (
	_ "embed"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

//go:embed testdata/abupgrade-check.sh
var abUpgradeCheck string

// TestABUpgrade: factory 1.0 (the A/B base's OS 1.0) boots; the 1.1 stick
// (a delta: OS 1.1, which adds jq and says VERSION_ID 1.1, and app:1.1) is
// imported: slot b written and proven, the entry kiln-1.1.0+3.conf written
// last. The reboot boots it: /usr is 1.1's from usr-b, the health check
// confirms 1.1 and systemd-bless-boot blesses the entry. The 1.2 stick
// (its initramfs's /init exits: the kernel panics, panic=5 reboots) is
// imported; its three tries panic, systemd-boot boots 1.1's entry again,
// and kiln's begin rolls 1.2 back by itself and removes its entry. One
// QEMU process, six boots.
func TestABUpgrade(t *testing.T) {
	vm.Schedule(t, 15*time.Minute)
	ab := fixture.ABBase(t)
	rels := []upgradeRelease{
		{"1.0.0", []string{pauseRef, appRepo + ":1.0"}, appRepo + ":1.0", []string{"factory"}, ""},
		{"1.1.0", []string{pauseRef, appRepo + ":1.1"}, appRepo + ":1.1", []string{"factory"}, "factory"},
		{"1.2.0", []string{pauseRef, appRepo + ":1.2"}, appRepo + ":1.2", []string{"factory"}, "factory"},
	}
	set := newUpgradeSet(t, abUpgradeCheck, upgradeOptions{releases: rels,
		bases: map[string]string{
			"1.0.0": ab.Path,
			"1.1.0": fixture.ABBaseRelease(t, fixture.ABRelease11).Path,
			"1.2.0": fixture.ABBaseRelease(t, fixture.ABReleaseUnbootable).Path,
		},
		script: map[string]string{"USR_A": fixture.UsrAPartUUID, "USR_B": fixture.UsrBPartUUID},
	})
	tech := &technician{t: t, sticks: set.sticks}
	res := vm.Boot(t, set.disk, append(tech.hands(), vm.WithName("ab-upgrade"), vm.WithReboots(),
		vm.WithoutFailOn("Kernel panic"), vm.WithTimeout(applianceTimeout(40*time.Minute)))...)
	t.Logf("A/B upgrade: %s in one QEMU run", res.Duration.Round(time.Second))
	for _, step := range []string{"b1-boot PASS", "kiln-e2e: plug 1.1.0", "release 1.1.0 is staged", "b2-boot PASS", "b2-blessed",
		"kiln-e2e: plug 1.2.0", "release 1.2.0 is staged", fixture.HaltInitLine, "b3-boot PASS", "b3-rolled-back"} {
		if d, ok := res.When(step); ok {
			t.Logf("step %-40q at %s", step, d.Round(time.Second))
		} else {
			t.Logf("step %-40q never came", step)
		}
	}
	root := mustFind(t, set.disk, "root")
	readJournal(t, root, strings.TrimSuffix(res.Console, ".txt")+"-journal.txt")

	requireAllPass(t, res)
	for _, name := range []string{
		"b1-current", "b1-booted-entry", "b1-os-release", "b1-usr-slot", "b1-staged", "b1-stick-removed",
		"b2-current", "b2-booted-entry", "b2-os-release", "b2-usr-slot", "b2-os-1.1-package", "b2-status-booted", "b2-blessed", "b2-entries", "b2-cri-workload", "b2-staged",
		"b3-current", "b3-booted-entry", "b3-os-release", "b3-usr-slot", "b3-rolled-back", "b3-begin-said-so", "b3-entries", "b3-cri-workload",
	} {
		requirePass(t, res, name)
	}
	for _, want := range []string{
		`os: writing `, `into "usr-b" (slot b)`, "os: slot b proven: dm-verity root hash ",
		"boot loader: entry kiln-1.1.0+3.conf of release 1.1.0 written, 3 tries",
		"release 1.1.0 passed its health check and is now current",
		"boot loader: entry kiln-1.2.0+3.conf of release 1.2.0 written, 3 tries",
		"kiln: release 1.2.0 never reached boot-complete: the boot loader tried its entry 3 times",
	} {
		if _, ok := res.When(want); !ok {
			t.Errorf("console lacks %q", want)
		}
	}
	if got := len(res.Lines(fixture.HaltInitLine)); got != 3 {
		t.Errorf("1.2's initramfs ran %d times, want its 3 tries", got)
	}
	final, b := finalState(t, root)
	if final.Current.Version != "1.1.0" || final.Staged != nil || final.Trying != nil || final.Last == nil ||
		final.Last.Action != "rollback" || final.Last.Version != "1.2.0" || final.Current.OS == nil || final.Current.OS.Slot != "b" {
		t.Errorf("final state:\n%s", b)
	}
}
