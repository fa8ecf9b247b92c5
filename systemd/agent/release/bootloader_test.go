package release

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// The OS of the releases on a node whose OS is in A/B slots: the factory's
// 1.0 boots slot A from the factory's entry; 1.1 was written into slot B
// by its import, with an entry of its own.
var (
	os10 = contract.ReleaseOS{Slot: contract.SlotA, RootHash: strings.Repeat("a0", 32), Entry: "kiln-1.0"}
	os11 = contract.ReleaseOS{Slot: contract.SlotB, RootHash: strings.Repeat("b1", 32), Entry: "kiln-1.1.0",
		Title: "acme 1.1", Version: "1.1", Linux: bootloader.BootFilePath(sha("kernel 1.1")),
		Initrd:  []string{bootloader.BootFilePath(sha("initrd 1.1"))},
		Options: []string{"root=LABEL=root", "rw", "usrhash=" + strings.Repeat("b1", 32)}}
)

const efiVendor = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"

// osNode is a node of the factory release 1.0 with its OS in slot A: its
// entry on the ESP, booted.
func osNode(t *testing.T) *node {
	t.Helper()
	n := newNode(t)
	n.writeESP(t, "loader/entries/kiln-1.0.conf", "title acme\nversion 1.0\nlinux /kiln/1.0/vmlinuz\noptions usrhash="+os10.RootHash+"\n")
	n.writeESP(t, "kiln/1.0/vmlinuz", "kernel 1.0")
	n.boot(t, "kiln-1.0.conf")
	if _, err := n.machine("b0").Init(context.Background(), contract.Release{Version: "1.0.0", Images: testReleases["1.0.0"].record().Images, OS: &os10}); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *node) writeESP(t *testing.T, p, content string) {
	t.Helper()
	f := filepath.Join(n.root, bootloader.ESP, p)
	os.MkdirAll(filepath.Dir(f), 0o755)
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// boot sets the entry the boot loader says it booted (LoaderEntrySelected:
// the file name it found, counter included).
func (n *node) boot(t *testing.T, name string) {
	t.Helper()
	b := []byte{7, 0, 0, 0}
	for _, c := range utf16.Encode([]rune(name + "\x00")) {
		b = append(b, byte(c), byte(c>>8))
	}
	dir := filepath.Join(n.root, bootloader.Efivars)
	os.MkdirAll(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "LoaderEntrySelected-"+efiVendor), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// entries are the entry files on the ESP.
func (n *node) entries(t *testing.T) string {
	t.Helper()
	names, err := bootloader.Entries(filepath.Join(n.root, bootloader.ESP))
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, x := range names {
		s = append(s, x.String())
	}
	return strings.Join(s, " ")
}

// rename renames an entry as the boot loader does when it counts a boot.
func (n *node) rename(t *testing.T, from, to string) {
	t.Helper()
	dir := filepath.Join(n.root, bootloader.ESP, bootentry.Dir)
	if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		t.Fatal(err)
	}
}

// stageOS imports release 1.1 with its OS in slot B, as the import does: its
// boot files on the ESP, then the release staged (the machine writes the
// entry).
func (n *node) stageOS(t *testing.T) {
	t.Helper()
	n.writeESP(t, os11.Linux, "kernel 1.1")
	n.writeESP(t, os11.Initrd[0], "initrd 1.1")
	r := testReleases["1.1.0"].record()
	o := os11
	r.OS = &o
	testReleases["1.1.0"].importBlobs(t, n.root)
	if _, err := n.machine("b0").Stage(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

func (n *node) mustDo(t *testing.T, boot string, f func(m *Machine) (*state.State, error)) *state.State {
	t.Helper()
	var log bytes.Buffer
	s, err := f(n.machine(boot, WithLog(&log)))
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Logf("%s", log.String())
	return s
}

func begin(m *Machine) (*state.State, error) { return m.Begin(context.Background()) }

// fellBack: 1.1's entry (file from) ran out of tries and the boot loader
// booted 1.0's; the next begin puts the node back on 1.0 by itself, says
// so on the console and in the last result (with msg), and leaves only
// 1.0's entry.
func (n *node) fellBack(t *testing.T, from, msg string) *state.State {
	t.Helper()
	n.rename(t, from, "kiln-1.1.0+0-3.conf")
	n.boot(t, "kiln-1.0.conf")
	var log bytes.Buffer
	s, err := n.machine("b4", WithLog(&log)).Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Trying != nil || s.Current.Version != "1.0.0" || s.Last.Action != "rollback" || s.Last.OK || !strings.Contains(s.Last.Message, msg) {
		t.Errorf("state %s, last %+v; want 1.0 current, the rollback saying %q", describe(s), s.Last, msg)
	}
	if !strings.Contains(log.String(), "kiln: "+s.Last.Message+"; the node is back on release 1.0.0") {
		t.Errorf("the console does not say so:\n%s", log.String())
	}
	if got := n.entries(t); got != "kiln-1.0.conf" {
		t.Errorf("entries %q: 1.1's must be gone, so the boot loader cannot pick it again", got)
	}
	n.checkConverged(t)
	// The same stick again: refused, the fallback's reason kept.
	if f := s.Failure("1.1.0"); f == nil || f.Message != s.Last.Message {
		t.Errorf("failures %+v: want 1.1's fallback", s.Failures())
	}
	r := testReleases["1.1.0"].record()
	o := os11
	r.OS = &o
	before := n.snapshot(t)
	if _, err := n.machine("b4").Stage(context.Background(), r); !errors.Is(err, ErrFailedBefore) || !strings.Contains(err.Error(), msg) {
		t.Errorf("stage of 1.1 again after the fallback: %v", err)
	}
	if d := diffSnapshots(before, n.snapshot(t)); d != "" {
		t.Errorf("the refusal changed the node:\n%s", d)
	}
	return s
}

func (n *node) espHas(p string) bool {
	_, err := os.Stat(filepath.Join(n.root, bootloader.ESP, p))
	return err == nil
}

// The release state follows the boot loader: staged with an entry of its
// own, a release is tried only when the boot loader booted that entry;
// when its tries run out (never reaching userspace, or never reaching
// boot-complete) or its health check fails, the state goes back by itself
// and the entry is removed so the boot loader cannot pick it again; a
// confirm leaves the blessing to systemd-bless-boot.
func TestStateFollowsBootLoader(t *testing.T) {
	staged := osNode(t)
	staged.stageOS(t)
	if got, want := staged.entries(t), "kiln-1.0.conf kiln-1.1.0+3.conf"; got != want {
		t.Fatalf("after staging: entries %q, want %q (the staged release's entry written with 3 tries)", got, want)
	}
	if s := staged.checkConverged(t); s.Staged == nil || !reflect.DeepEqual(*s.Staged.OS, os11) {
		t.Fatalf("staged %+v", s.Staged)
	}

	trying := staged.copyTo(t)
	trying.boot(t, "kiln-1.1.0+3.conf")
	trying.rename(t, "kiln-1.1.0+3.conf", "kiln-1.1.0+2-1.conf")
	if s := trying.mustDo(t, "b1", begin); s.Trying == nil || s.Trying.Version != "1.1.0" || s.Staged != nil {
		t.Fatalf("booted the staged entry: %s, want 1.1.0 trying", describe(s))
	}
	// Not blessed while tried: the boot loader may mark the entry good
	// only once its release is confirmed.
	if _, err := trying.machine("b1").Confirmed(); !errors.Is(err, ErrNotConfirmed) || !strings.Contains(err.Error(), "release 1.1.0 is being tried") {
		t.Errorf("Confirmed while trying: %v", err)
	}
	if r, err := staged.machine("b1").Confirmed(); err != nil || r.Version != "1.0.0" {
		t.Errorf("Confirmed on a boot of 1.0's entry with 1.1 staged: %v %v, want 1.0 (current)", r, err)
	}

	t.Run("booted, confirmed: the entry is left to systemd-bless-boot", func(t *testing.T) {
		n := trying.copyTo(t)
		s := n.mustDo(t, "b1", func(m *Machine) (*state.State, error) { return m.Confirm(context.Background(), "1.1.0") })
		if s.Current.Version != "1.1.0" || s.Previous.Version != "1.0.0" {
			t.Errorf("confirmed: %s", describe(s))
		}
		if got, want := n.entries(t), "kiln-1.0.conf kiln-1.1.0+2-1.conf"; got != want {
			t.Errorf("entries %q, want %q: kiln never rewrites a counter", got, want)
		}
		if r, err := n.machine("b1").Confirmed(); err != nil || r.Version != "1.1.0" {
			t.Errorf("Confirmed after the confirm: %v %v", r, err)
		}
		n.checkConverged(t)

		// Its tries ran out before a boot reached boot-complete (the
		// blessing): the boot loader booted 1.0 again, and so the node is 1.0.
		if s := n.fellBack(t, "kiln-1.1.0+2-1.conf", "was confirmed but its boot entry never blessed"); s.Previous != nil {
			t.Errorf("previous %s: 1.0 is current again", s.Previous.Version)
		}
	})

	t.Run("tried, its tries ran out: back on 1.0 by itself", func(t *testing.T) {
		n := trying.copyTo(t)
		n.fellBack(t, "kiln-1.1.0+2-1.conf", "did not reach boot-complete within its tries: the boot loader booted kiln-1.0 (release 1.0.0) again")
		if n.espHas(os11.Linux) || !n.espHas("kiln/1.0/vmlinuz") {
			t.Error("1.1's kernel must be removed from the ESP, 1.0's kept")
		}
		n.checkConverged(t)
		st, err := n.machine("b4").Status()
		if err != nil || st.Last.Action != "rollback" || st.Booted != "kiln-1.0" {
			t.Errorf("status %+v (%v): want the rollback and the booted entry", st, err)
		}
	})

	t.Run("tried, its health check failed: rolled back, its entry removed", func(t *testing.T) {
		n := trying.copyTo(t)
		s := n.mustDo(t, "b1", func(m *Machine) (*state.State, error) {
			return m.Rollback(context.Background(), "1.1.0", "health check failed")
		})
		if s.Current.Version != "1.0.0" || s.Trying != nil {
			t.Errorf("state %s", describe(s))
		}
		if got := n.entries(t); got != "kiln-1.0.conf" {
			t.Errorf("entries %q: the rolled back release's entry must be gone before the reboot", got)
		}
		n.checkConverged(t)
	})

	t.Run("staged, never reached userspace: its tries ran out", func(t *testing.T) {
		n := staged.copyTo(t)
		if s := n.fellBack(t, "kiln-1.1.0+3.conf", "release 1.1.0 never reached boot-complete: the boot loader tried its entry 3 times"); s.Staged != nil {
			t.Errorf("still staged: %s", describe(s))
		}
	})

	t.Run("staged, another entry booted while its own has tries: still staged", func(t *testing.T) {
		n := staged.copyTo(t)
		before := n.snapshot(t)
		n.mustDo(t, "b1", begin)
		if d := diffSnapshots(before, n.snapshot(t)); d != "" {
			t.Errorf("the node changed:\n%s", d)
		}
	})

	t.Run("staged, its entry not written yet (an import cut before it): written at boot", func(t *testing.T) {
		n := staged.copyTo(t)
		os.Remove(filepath.Join(n.root, bootloader.ESP, bootentry.Dir, "kiln-1.1.0+3.conf"))
		s := n.mustDo(t, "b1", begin)
		if s.Staged == nil || n.entries(t) != "kiln-1.0.conf kiln-1.1.0+3.conf" {
			t.Errorf("state %s, entries %q", describe(s), n.entries(t))
		}
	})

	t.Run("abandoned: its entry removed", func(t *testing.T) {
		n := staged.copyTo(t)
		n.mustDo(t, "b1", func(m *Machine) (*state.State, error) { return m.Abandon(context.Background(), "1.1.0") })
		if got := n.entries(t); got != "kiln-1.0.conf" {
			t.Errorf("entries %q", got)
		}
	})
}

// A release that brings no OS runs the one it is staged on: it shares the
// current release's entry, and is tried on the boot that boots it.
func TestImagesOnlyReleaseKeepsTheOS(t *testing.T) {
	n := osNode(t)
	testReleases["1.1.0"].importBlobs(t, n.root)
	s := n.mustDo(t, "b0", func(m *Machine) (*state.State, error) {
		return m.Stage(context.Background(), testReleases["1.1.0"].record())
	})
	if s.Staged.OS == nil || !reflect.DeepEqual(*s.Staged.OS, os10) {
		t.Fatalf("staged OS %+v, want 1.0's", s.Staged.OS)
	}
	if s := n.mustDo(t, "b1", begin); s.Trying == nil {
		t.Errorf("not tried: %s", describe(s))
	}
	if got := n.entries(t); got != "kiln-1.0.conf" {
		t.Errorf("entries %q", got)
	}
}

// Staging an OS into a slot: refused when the current release runs from it;
// a previous release whose OS was in it is no longer kept.
func TestStageOSSlot(t *testing.T) {
	n := osNode(t)
	r := testReleases["1.1.0"].record()
	o := os11
	o.Slot = contract.SlotA
	r.OS = &o
	testReleases["1.1.0"].importBlobs(t, n.root)
	before := n.snapshot(t)
	if _, err := n.machine("b0").Stage(context.Background(), r); err == nil || !strings.Contains(err.Error(), "slot a, which the current release 1.0.0 runs from") {
		t.Errorf("staged into the running slot: %v", err)
	}
	if d := diffSnapshots(before, n.snapshot(t)); d != "" {
		t.Errorf("a refused stage changed the node:\n%s", d)
	}

	// 1.1 in B confirmed; 1.2 written into A, where 1.0 (previous) was.
	n.stageOS(t)
	n.boot(t, "kiln-1.1.0+3.conf")
	n.mustDo(t, "b1", begin)
	n.mustDo(t, "b1", func(m *Machine) (*state.State, error) { return m.Confirm(context.Background(), "1.1.0") })
	r12 := testReleases["1.2.0"].record()
	o12 := os11
	o12.Slot, o12.RootHash, o12.Entry = contract.SlotA, strings.Repeat("c2", 32), "kiln-1.2.0"
	r12.OS = &o12
	testReleases["1.2.0"].importBlobs(t, n.root)
	s := n.mustDo(t, "b1", func(m *Machine) (*state.State, error) { return m.Stage(context.Background(), r12) })
	if s.Previous != nil || s.Current.Version != "1.1.0" || s.Staged.Version != "1.2.0" {
		t.Errorf("state %s: 1.0's slot is 1.2's now, so 1.0 is not kept", describe(s))
	}
	n.checkConverged(t)
}

// The begin that takes the node back to 1.0 after 1.1's tries ran out
// (tried, and staged: never reached userspace), killed at each of its steps:
// run again (the next boot's begin), it gives the node an uninterrupted one
// gives.
func TestFallBackKilledAtEveryStep(t *testing.T) {
	t.Parallel()
	staged := osNode(t)
	staged.stageOS(t)
	trying := staged.copyTo(t)
	trying.boot(t, "kiln-1.1.0+3.conf")
	trying.rename(t, "kiln-1.1.0+3.conf", "kiln-1.1.0+2-1.conf")
	trying.mustDo(t, "b1", begin)
	for name, base := range map[string]*node{"tried": trying, "staged": staged} {
		t.Run(name, func(t *testing.T) {
			names, _ := bootloader.Entries(filepath.Join(base.root, bootloader.ESP))
			for _, n := range names {
				if n.ID == "kiln-1.1.0" {
					base.rename(t, n.String(), "kiln-1.1.0+0-3.conf")
				}
			}
			base.boot(t, "kiln-1.0.conf")
			o := op{Action: "begin", Boot: "b4"}
			clean := base.copyTo(t)
			var steps []string
			if _, err := clean.run(t, clean.machine(o.Boot, WithStepHook(occurrences(func(s string) { steps = append(steps, s) }))), o); err != nil {
				t.Fatal(err)
			}
			want := clean.snapshot(t)
			t.Logf("%d steps: %q", len(steps), steps)
			if !slices.Contains(steps, "remove entry kiln-1.1.0#1") {
				t.Fatalf("steps %q", steps)
			}
			for _, step := range steps {
				killed := base.copyTo(t)
				if !killed.runChild(t, o, step) {
					t.Errorf("begin did not reach %q", step)
					continue
				}
				killed.checkSafe(t)
				killed.runChild(t, o, "")
				if d := diffSnapshots(want, killed.snapshot(t)); d != "" {
					t.Errorf("killed at %q, then run again: the node differs from an uninterrupted run:\n%s", step, d)
				}
				if got := killed.entries(t); got != "kiln-1.0.conf" {
					t.Errorf("killed at %q, then run again: entries %q", step, got)
				}
			}
		})
	}
}
