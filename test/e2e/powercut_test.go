//go:build e2e

package e2e

// Power cuts during and after a field upgrade (issue 27): CRI-O wipes its
// own store after an unclean shutdown, and the images a field upgrade loads
// live there; kiln must put them back at boot, before the workload and the
// health check, so nothing that passed is rolled back. The factory release's
// power cuts are in TestApplianceBoots and TestApplianceCopyMode.

import (
	_ "embed"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

//go:embed testdata/upgrade-powercut.sh
var upgradePowerCut string

// TestFieldUpgradePowerCuts: factory 1.0 takes the 1.1 stick; the power is
// cut during the upgrade boot while the workload runs 1.1 and before the
// health check decided; the next boot (the release's second attempt)
// restores 1.1's image, runs the workload and confirms 1.1; the power is cut
// again; the next boot restores it again and runs 1.1, with 1.1 and 1.0
// pinned. Four boots of one QEMU process.
func TestFieldUpgradePowerCuts(t *testing.T) {
	vm.Schedule(t, 12*time.Minute)
	set := newUpgradeSet(t, upgradePowerCut, upgradeOptions{command: "[/usr/bin/test, -e, /run/kiln-e2e-healthy]", timeout: 6 * time.Minute})
	tech := &technician{t: t, sticks: set.sticks}
	cuts := 0
	res := vm.Boot(t, set.disk, append(tech.hands(), vm.WithName("upgrade-power-cuts"), vm.WithReboots(),
		vm.WithTimeout(applianceTimeout(40*time.Minute)),
		vm.OnConsole(powerCut, func(m *vm.Monitor, line string) error {
			cuts++
			t.Logf("cutting the power (QEMU system_reset): %s", line)
			return m.Reset()
		}))...)
	t.Logf("upgrade with power cuts: %s in one QEMU run", res.Duration.Round(time.Second))
	for _, step := range []string{"b1-boot PASS", "release 1.1.0 is staged", "b2-boot PASS", "b2-cri-workload", powerCut,
		"b3-boot PASS", "b3-restore", "b3-settled", "b4-boot PASS", "b4-restore", "b4-cri-workload"} {
		if d, ok := res.When(step); ok {
			t.Logf("step %-28q at %s", step, d.Round(time.Second))
		}
	}
	root := mustFind(t, set.disk, "root")
	readJournal(t, root, filepath.Join(filepath.Dir(res.Console), "upgrade-power-cuts-journal.txt"))

	requireAllPass(t, res)
	if cuts != 2 {
		t.Errorf("the power was cut %d times, want twice", cuts)
	}
	for _, name := range []string{
		"b1-settled", "b1-current", "b1-cri-workload", "b1-staged",
		"b2-begin-before-crio", "b2-trying", "b2-cri-workload",
		"b3-crio-unclean", "b3-restore", "b3-status-images", "b3-trying-again", "b3-cri-workload", "b3-settled", "b3-current", "b3-previous",
		"b4-crio-unclean", "b4-restore", "b4-status-images", "b4-settled", "b4-current", "b4-cri-workload", "b4-app-1.1-pinned", "b4-app-1.0-pinned",
	} {
		requirePass(t, res, name)
	}
	app11 := appRepo + ":1.1"
	afterFirst := res.After(powerCut)
	requireRestored(t, res, afterFirst.Until(powerCut), "b3-crio-unclean", app11, set.digests[app11])
	requireRestored(t, res, afterFirst.After(powerCut), "b4-crio-unclean", app11, set.digests[app11])
	for _, l := range res.All() {
		if strings.Contains(l, "rolled back") || strings.Contains(l, "failed its health check") {
			t.Errorf("console: %s", l)
		}
	}
	if _, ok := res.When("release 1.1.0 passed its health check and is now current"); !ok {
		t.Errorf("console lacks the confirmation of 1.1.0")
	}

	if final, b := finalState(t, root); final.Current.Version != "1.1.0" || final.Previous == nil || final.Previous.Version != "1.0.0" || final.Trying != nil ||
		final.Last == nil || final.Last.Action != "confirm" || !final.Last.OK {
		t.Errorf("final %s:\n%s", contract.StateFile, b)
	}
}
