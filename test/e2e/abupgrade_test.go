//go:build e2e

package e2e

// The whole appliance upgraded from a stick (issue 23): a factory disk built
// by kiln on the A/B base, whose OS is in slot a, takes a release whose OS
// differs, boots it from slot b with the entry the node wrote, and falls
// back by itself from a release whose initramfs cannot boot.

import (
	_ "embed"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/partitions/esp"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

//go:embed testdata/abupgrade-check.sh
var abUpgradeCheck string

// TestABUpgrade: factory 1.0 (the A/B base's OS 1.0) boots; the 1.1 stick
// (a delta: OS 1.1, which adds jq and says VERSION_ID 1.1, its own
// kiln-agent, and app:1.1) is imported: slot b written and proven, the
// entry kiln-1.1.0+3.conf written last. The reboot boots it: /usr is 1.1's
// from usr-b, every unit runs 1.1's agent, the health check confirms 1.1
// and systemd-bless-boot blesses the entry. The 1.2 stick (its initramfs's
// /init exits: the kernel panics, panic=5 reboots) is imported; its three
// tries panic, systemd-boot boots 1.1's entry again, and kiln's begin rolls
// 1.2 back by itself and removes its entry. The 1.3 stick (OS 1.0 again,
// into slot a, its own agent, a workload image it does not carry) boots
// with its agent, fails its health check and is rolled back: the node is
// on 1.1 with 1.1's agent. One QEMU process, eight boots; then kiln verify
// --booted proves slot b holds exactly the 1.1 base's slot.
func TestABUpgrade(t *testing.T) {
	vm.Schedule(t, 20*time.Minute)
	ab := fixture.ABBase(t)
	rels := []upgradeRelease{
		{"1.0.0", []string{pauseRef, appRepo + ":1.0"}, appRepo + ":1.0", []string{"factory"}, ""},
		{"1.1.0", []string{pauseRef, appRepo + ":1.1"}, appRepo + ":1.1", []string{"factory"}, "factory"},
		{"1.2.0", []string{pauseRef, appRepo + ":1.2"}, appRepo + ":1.2", []string{"factory"}, "factory"},
		{"1.3.0", []string{pauseRef, toolsRef}, appRepo + ":1.3", []string{"factory"}, "factory"},
	}
	base11 := fixture.ABBaseRelease(t, fixture.ABRelease11).Path
	checkABLayout(t, base11)
	requireSamePartitions(t, base11, ab.Path) // what a 1.0 node's slots must take
	set := newUpgradeSet(t, abUpgradeCheck, upgradeOptions{releases: rels,
		bases: map[string]string{
			"1.0.0": ab.Path,
			"1.1.0": base11,
			"1.2.0": fixture.ABBaseRelease(t, fixture.ABReleaseUnbootable).Path,
			"1.3.0": ab.Path,
		},
		// The node is back on 1.1 when 1.3 comes: its stick is a delta from 1.1.
		from:   map[string]string{"1.3.0": "1.1.0"},
		agents: map[string]string{"1.1.0": "1.1.0-e2e", "1.3.0": "1.3.0-e2e"},
		script: map[string]string{"USR_A": fixture.UsrAPartUUID, "USR_B": fixture.UsrBPartUUID},
	})
	tech := &technician{t: t, sticks: set.sticks}
	// 60 min for eight boots: on a slow day (2026-11-28, three machines at
	// once) 40 min ended the run at its fifth boot, each boot well inside
	// its own bounds. A hang is still caught by the boots' own waits first.
	res := vm.Boot(t, set.disk, append(tech.hands(), vm.WithName("ab-upgrade"), vm.WithReboots(),
		vm.WithoutFailOn("Kernel panic"), vm.WithTimeout(applianceTimeout(60*time.Minute)))...)
	t.Logf("A/B upgrade: %s in one QEMU run", res.Duration.Round(time.Second))
	for _, step := range []string{"b1-boot PASS", "kiln-e2e: plug 1.1.0", "release 1.1.0 is staged", "b2-boot PASS", "b2-blessed",
		"kiln-e2e: plug 1.2.0", "release 1.2.0 is staged", fixture.HaltInitLine, "b3-boot PASS", "b3-rolled-back",
		"kiln-e2e: plug 1.3.0", "release 1.3.0 is staged", "b4-boot PASS", "b5-boot PASS", "b5-rolled-back"} {
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
		"b2-agent-version", "b2-etc-var-kept", "b2-app-1.1-pinned", "b2-app-1.0-pinned",
		"b3-etc-var-kept", "b3-app-1.1-pinned", "b3-app-1.0-unpinned",
		"b5-etc-var-kept", "b5-app-1.1-pinned",
		"b3-current", "b3-booted-entry", "b3-os-release", "b3-usr-slot", "b3-rolled-back", "b3-begin-said-so", "b3-entries", "b3-agent-version", "b3-cri-workload", "b3-staged",
		"b4-booted-entry", "b4-os-release", "b4-usr-slot", "b4-agent-version", "b4-trying",
		"b5-current", "b5-booted-entry", "b5-os-release", "b5-usr-slot", "b5-agent-version", "b5-rolled-back", "b5-entries", "b5-cri-workload",
	} {
		requirePass(t, res, name)
	}
	for _, want := range []string{
		`os: writing `, `into "usr-b" (slot b)`, "os: slot b proven: dm-verity root hash ",
		"boot loader: entry kiln-1.1.0+3.conf of release 1.1.0 written, 3 tries",
		"release 1.1.0 passed its health check and is now current",
		"boot loader: entry kiln-1.2.0+3.conf of release 1.2.0 written, 3 tries",
		"kiln: release 1.2.0 never reached boot-complete: the boot loader tried its entry 3 times",
		`into "usr-a" (slot a)`,
		"boot loader: entry kiln-1.3.0+3.conf of release 1.3.0 written, 3 tries",
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
		final.Last.Action != "rollback" || final.Last.Version != "1.3.0" || final.Current.OS == nil || final.Current.OS.Slot != "b" {
		t.Errorf("final state:\n%s", b)
	}
	verifyUpgradedSlot(t, set.kiln, set.disk, base11)
}

// verifyUpgradedSlot runs kiln verify --booted on the node's disk after its
// last power-off: slot b must be checked, block by block through dm-verity,
// against the root hash kiln inspect shows for the 1.1 base (the vendor's
// factory image of that OS), and slot a, which 1.3's import wrote and no
// entry boots, is listed as not checked.
func verifyUpgradedSlot(t *testing.T, kiln, disk, base11 string) {
	t.Helper()
	out, err := exec.Command(kiln, "inspect", "-o", "json", base11).Output()
	if err != nil {
		t.Fatalf("kiln inspect %s: %v", base11, err)
	}
	var rep struct {
		OSSlots struct {
			RootHash string `json:"rootHash"`
		} `json:"osSlots"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || rep.OSSlots.RootHash == "" {
		t.Fatalf("kiln inspect %s: %v\n%s", base11, err, out)
	}
	got, err := exec.Command(kiln, "verify", "--booted", disk).CombinedOutput()
	t.Logf("kiln verify --booted of the node's disk:\n%s", got)
	if err != nil {
		t.Fatalf("kiln verify --booted: %v", err)
	}
	for _, want := range [][]string{
		{"ok ", "(usr-b) and ", "(usr-b-verity): every block through dm-verity (root hash " + rep.OSSlots.RootHash + ", as entry kiln-1.1.0 "},
		{"not checked ", "(usr-a)", ": no boot loader entry boots this slot"},
	} {
		if !slices.ContainsFunc(strings.Split(string(got), "\n"), func(l string) bool {
			return !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(l, w) })
		}) {
			t.Errorf("kiln verify --booted has no line with all of %q", want)
		}
	}
}

//go:embed testdata/abupgrade-reset.sh
var abUpgradeReset string

// slotWriteBegins is the console line of the import starting the slot
// write, and resetAfter how long after it TestABUpgradeReset resets.
const (
	slotWriteBegins = `os: writing `
	resetAfter      = 4 * time.Second
)

// TestABUpgradeReset: under Secure Boot (OVMF's Secure Boot firmware, its
// variables in setup mode as a new machine's), systemd-boot enrols the
// factory's keys from loader/keys/auto and resets the machine; factory 1.0
// then boots as the signed first-boot UKI, Secure Boot on, and reboots
// plainly, then takes the 1.1 stick (its signed UKI for slot b checked by
// the node before it writes anything), and the machine is hard reset (QEMU
// system_reset) 4 s into the import's write of slot b. The next boot runs
// 1.0 from its own signed image; the stick, still in, is imported again and
// keeps what the first import wrote; the reboot after it runs 1.1 from slot b
// through the UKI the node wrote, with the root hashes its signed command
// line names. It also times the upgrade reboot (the reboot into 1.1 → 1.1's
// workload running) against the plain reboot of 1.0 in the same run, and
// logs the ratio (docs/BENCHMARKS.md). Four boots of one QEMU process (and
// the enrolment's few seconds before them); kiln verify --booted then holds
// the images the node wrote to the db signature and the slots' root hashes.
func TestABUpgradeReset(t *testing.T) {
	vm.Schedule(t, 12*time.Minute)
	ab := fixture.ABBase(t)
	rels := []upgradeRelease{
		{"1.0.0", []string{pauseRef, appRepo + ":1.0"}, appRepo + ":1.0", []string{"factory"}, ""},
		{"1.1.0", []string{pauseRef, appRepo + ":1.1"}, appRepo + ":1.1", []string{"factory"}, "factory"},
	}
	set := newUpgradeSet(t, abUpgradeReset, upgradeOptions{releases: rels,
		bases:      map[string]string{"1.0.0": ab.Path, "1.1.0": fixture.ABBaseRelease(t, fixture.ABRelease11).Path},
		script:     map[string]string{"USR_A": fixture.UsrAPartUUID, "USR_B": fixture.UsrBPartUUID},
		secureBoot: true,
	})
	if out, err := exec.Command(set.kiln, "verify", set.disk).CombinedOutput(); err != nil {
		t.Fatalf("kiln verify of the built disk: %v\n%s", err, out)
	}
	images := firstBootImagesRootHash(t, set.disk)
	tech := &technician{t: t, sticks: set.sticks}
	resets := 0
	res := vm.Boot(t, set.disk, append(tech.hands(), vm.WithName("ab-upgrade-reset"), vm.WithReboots(), vm.WithSecureBoot(),
		vm.WithTimeout(applianceTimeout(45*time.Minute)), // took 26 min on 2026-11-28, three machines at once
		vm.OnConsole(slotWriteBegins, func(m *vm.Monitor, line string) error {
			if resets > 0 {
				return nil
			}
			resets++
			// Into the write (about 15 s under TCG), not at its first byte.
			time.Sleep(resetAfter)
			t.Logf("resetting the machine (QEMU system_reset) %s after the slot write began: %s", resetAfter, line)
			return m.Reset()
		}))...)
	t.Logf("A/B upgrade with a reset: %s in one QEMU run", res.Duration.Round(time.Second))
	root := mustFind(t, set.disk, "root")
	readJournal(t, root, strings.TrimSuffix(res.Console, ".txt")+"-journal.txt")

	enrol, ok := res.When("Enrolling secure boot keys from directory: \\loader\\keys\\auto")
	if !ok {
		t.Errorf("systemd-boot did not enrol the keys from loader/keys/auto")
	}
	if boot, ok := res.When("KILN-E2E: b1-secure-boot "); !ok || boot < enrol {
		t.Errorf("no Secure Boot check after the enrolment")
	}
	requireAllPass(t, res)
	requireDetail(t, res, "b1-images-roothash", images)
	for _, name := range []string{
		"b1-secure-boot", "b1-kernel-secure-boot", "b1-lockdown", "b1-db-in-kernel", "b1-stub", "b1-ignition",
		"b1-usr-roothash", "b1-images-roothash", "b1-mount-verity",
		"b4-secure-boot", "b4-kernel-secure-boot", "b4-stub", "b4-usr-roothash", "b4-images-roothash", "b4-mount-verity", "b4-failed-units",
		"b1-settled", "b1-booted-entry", "b1-usr-slot", "b1-cri-workload",
		"b2-cri-workload", "b2-settled", "b2-booted-entry",
		"b3-booted-entry", "b3-os-release", "b3-usr-slot", "b3-current", "b3-staged", "b3-stick-removed",
		"b4-cri-workload", "b4-settled", "b4-current", "b4-booted-entry", "b4-os-release", "b4-usr-slot",
	} {
		requirePass(t, res, name)
	}
	if resets != 1 {
		t.Fatalf("the machine was reset %d times, want once", resets)
	}
	// Before the reset: the write began, nothing was staged. After it: the
	// same stick's import kept what the first wrote, and staged 1.1.
	before, after := res.Until(slotWriteBegins), res.After(slotWriteBegins)
	if _, ok := before.When("release 1.1.0 is staged"); ok {
		t.Errorf("1.1.0 was staged before the reset")
	}
	for _, want := range []string{`into "usr-b" (slot b), keeping what an earlier import wrote`, "os: slot b proven: dm-verity root hash ", "release 1.1.0 is staged"} {
		if _, ok := after.When(want); !ok {
			t.Errorf("after the reset, the console lacks %q", want)
		}
	}
	// The reboots, paired: each from the line before its shutdown to the
	// workload's check on the next boot.
	plain, okP := between(res, "kiln-e2e: rebooting plainly", "b2-cri-workload PASS")
	upgrade, okU := between(res, "kiln-e2e: rebooting to try 1.1.0", "b4-cri-workload PASS")
	if okP && okU {
		t.Logf("reboot to the workload running: plain (1.0) %s, upgrade (into 1.1) %s: ratio %.2f",
			plain.Round(time.Second), upgrade.Round(time.Second), upgrade.Seconds()/plain.Seconds())
	}
	out, err := exec.Command(set.kiln, "verify", "--booted", set.disk).CombinedOutput()
	t.Logf("kiln verify --booted of the node's disk:\n%s", out)
	if err != nil {
		t.Errorf("kiln verify --booted: %v", err)
	}
	// Slot b, which the UKI the node wrote boots, proved through dm-verity.
	if !anyLineIn(string(out), "(usr-b-verity): every block through dm-verity (root hash ", "as entry kiln-1.1.0 ") {
		t.Errorf("kiln verify --booted did not prove slot b by the image that boots it")
	}
}

// anyLineIn: one line of out holds every part.
func anyLineIn(out string, parts ...string) bool {
	return slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool {
		return !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(l, p) })
	})
}

// firstBootImagesRootHash is the image partition's root hash the signed
// first-boot UKI of a Secure Boot disk names on its command line.
func firstBootImagesRootHash(t *testing.T, disk string) string {
	t.Helper()
	espPart := mustFind(t, disk, "EFI-SYSTEM")
	firstBoot := filepath.Join(t.TempDir(), "ignition-firstboot.efi")
	if err := (esp.FS{Disk: disk, Offset: espPart.Offset}).CopyOut("EFI/Linux/ignition-firstboot.efi", firstBoot); err != nil {
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
	return images
}

// between is the time from the first console line holding from to the
// first one after it holding to.
func between(r *vm.Result, from, to string) (time.Duration, bool) {
	a, ok := r.When(from)
	if !ok {
		return 0, false
	}
	b, ok := r.After(from).When(to)
	return b - a, ok
}
