//go:build e2e

package e2e

// The kubelet's image garbage collector against kiln's pins (issue 24).
// CRI-O's pinned_images exist for one consumer: the kubelet's collector
// leaves an image alone when the CRI says it is pinned. The appliance and
// upgrade scenarios show the images are marked pinned; this one shows they
// survive the collector, and that without the pins they would not.

import (
	_ "embed"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

//go:embed testdata/upgrade-gc.sh
var upgradeGC string

// gcHealthTimeout bounds the health check of the scenario's releases. The
// broken release is rolled back when it ends, and by then the collector
// must have run (within a minute or two of the kubelet's start under TCG:
// the eviction manager's pressure, upgrade-gc.sh) and the checks after it.
const gcHealthTimeout = 4 * time.Minute

// TestImageGC: factory 1.0 (preload mode copy: every image in CRI-O's
// writable store) takes the 1.1 stick; 1.1 is confirmed (1.0 previous).
// The disk is filled past the kubelet's image GC threshold with images no
// release has, and a broken 1.3 is tried: while its pod cannot start, the
// current release (the rollback target) runs nothing. The collector removes
// fill images only; the images of 1.3, 1.1 and 1.0 stay, pinned. The health
// check rolls 1.3 back, and 1.1 runs offline on the image the collector
// kept, with nothing restored. Then the pins drop-in is removed and the disk
// filled again: the collector removes 1.0's image (so the test can fail).
// Four boots of one QEMU process.
func TestImageGC(t *testing.T) {
	vm.Schedule(t, 18*time.Minute)
	set := newUpgradeSet(t, upgradeGC, upgradeOptions{timeout: gcHealthTimeout, copyMode: true, waitOutBroken: true})
	// The broken release, as a delta from 1.1 (the node runs 1.1 when it
	// is plugged), signed by the key 1.1 brought.
	set.bundle(t, "1.3.0-on-1.1", "1.3.0", "--key", filepath.Join(set.dir, "rotated.key"), "--from", set.sticks["1.1.0"])
	tech := &technician{t: t, sticks: set.sticks}
	res := vm.Boot(t, set.disk, append(tech.hands(), vm.WithName("image-gc"), vm.WithReboots(),
		vm.WithTimeout(applianceTimeout(45*time.Minute)))...)
	t.Logf("image GC: %s in one QEMU run", res.Duration.Round(time.Second))
	for _, step := range []string{"b1-boot PASS", "b2-boot PASS", "b2-fill", "b3-boot PASS", "b3-workload-failed", "b3-gc-ran",
		"rolled back to 1.1.0", "b4-boot PASS", "b4-fill", "b4-unpinned-collected"} {
		if d, ok := res.When(step); ok {
			t.Logf("step %-28q at %s", step, d.Round(time.Second))
		}
	}
	root := mustFind(t, set.disk, "root")
	readJournal(t, root, filepath.Join(filepath.Dir(res.Console), "image-gc-journal.txt"))

	requireAllPass(t, res)
	if strings.Join(tech.plugs, " ") != "1.1.0 1.3.0-on-1.1" {
		t.Errorf("sticks plugged: %v, want 1.1.0 1.3.0-on-1.1", tech.plugs)
	}
	for _, name := range []string{
		"b1-settled", "b1-cri-workload",
		"b2-settled", "b2-previous", "b2-cri-workload", "b2-fill", "b2-staged",
		"b3-trying", "b3-workload-failed", "b3-gc-ran", "b3-gc-removed-fills-only", "b3-gc-fills-absent",
		"b3-gc-kept-current", "b3-gc-kept-previous", "b3-gc-kept-trying", "b3-gc-kept-pause",
		"b4-settled", "b4-rolled-back", "b4-cri-workload", "b4-nothing-restored",
		"b4-unpinned-previous", "b4-fill", "b4-unpinned-collected", "b4-unpinned-absent",
	} {
		requirePass(t, res, name)
	}
	for _, want := range []string{
		"release 1.1.0 passed its health check and is now current",
		"kiln: release 1.3.0 failed its health check: after " + gcHealthTimeout.String() + " command " + podHealthLine + " failed",
		"; rolled back to 1.1.0",
	} {
		if _, ok := res.When(want); !ok {
			t.Errorf("console lacks %q", want)
		}
	}
}
