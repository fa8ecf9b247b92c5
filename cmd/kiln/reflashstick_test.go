//go:build !nodeonly

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder/reflashstick"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

// The stick: a valid GPT, a valid Ignition config running the reflash, a
// payload partition holding exactly the disk; and the agent on it writes a
// target that kiln verify then accepts.
func TestReflashStick(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	disk := filepath.Join(f.dir, "appliance.raw")
	mustKiln(t, f, "build", f.recipe, "-o", disk)
	stick := filepath.Join(f.dir, "stick.raw")
	out := mustKiln(t, f, "reflash-stick", f.recipe, "--disk", disk, "-o", stick, "--unattended")
	if !strings.Contains(out, "wrote "+stick) || !strings.Contains(out, "unattended: writes without asking") {
		t.Fatalf("reflash-stick says:\n%s", out)
	}

	if out := mustKiln(t, f, "verify", stick); !strings.Contains(out, "OK (exactly the bytes kiln reflash-stick wrote)") {
		t.Errorf("kiln verify %s:\n%s", stick, out)
	}
	checkStickInspect(t, f, stick, disk, out)
	// Onto a "stick" with kiln write (checked, written, read back), and the
	// written stick verifies too.
	fi, _ := os.Stat(stick)
	dev, _ := loopDevice(t, fi.Size())
	mustKiln(t, f, "write", "--force", stick, dev)
	if out := mustKiln(t, f, "verify", dev); !strings.Contains(out, "OK (exactly the bytes kiln reflash-stick wrote)") {
		t.Errorf("kiln verify %s:\n%s", dev, out)
	}
	if v := run(t, "sgdisk", "-v", stick); !strings.Contains(v, "No problems found") {
		t.Errorf("sgdisk -v %s:\n%s", stick, v)
	}
	layout, err := gpt.Inspect(stick)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := layout.Find(recovery.PartitionName)
	if !ok || !strings.EqualFold(p.Type, recovery.PartitionType) {
		t.Fatalf("no %s partition of type %s: %+v", recovery.PartitionName, recovery.PartitionType, layout.Partitions)
	}
	ign, err := bootconfig.Read(stick)
	if err != nil {
		t.Fatal(err)
	}
	ignPath := filepath.Join(f.dir, "stick.ign")
	os.WriteFile(ignPath, ign, 0o644)
	run(t, "ignition-validate", ignPath)
	for _, want := range []string{recovery.Unit, "run-kiln-reflash.mount", "agent reflash --unattended", "by-partuuid/" + strings.ToLower(p.GUID)} {
		if !strings.Contains(string(ign), want) {
			t.Errorf("the stick's Ignition config lacks %q", want)
		}
	}

	// One byte flipped in the payload: kiln verify and kiln write refuse it.
	damaged := filepath.Join(f.dir, "damaged-stick.raw")
	run(t, "cp", "--sparse=always", stick, damaged)
	fd, err := os.OpenFile(damaged, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	fd.ReadAt(b, p.Offset+p.Size/2)
	b[0] ^= 0xff
	fd.WriteAt(b, p.Offset+p.Size/2)
	fd.Close()
	if out, code := kiln(t, f, "verify", damaged); code != 1 || !strings.Contains(out, "the stick is damaged or was modified") {
		t.Errorf("kiln verify of a damaged stick: exit %d\n%s", code, out)
	}
	if out, code := kiln(t, f, "write", "--force", damaged, dev); code != 1 || !strings.Contains(out, "not writing "+damaged) {
		t.Errorf("kiln write of a damaged stick: exit %d\n%s", code, out)
	}

	mnt := mountPartition(t, stick, recovery.PartitionName)
	if got, want := sha256File(t, filepath.Join(mnt, recovery.DiskFile)), sha256File(t, disk); got != want {
		t.Fatalf("the payload's disk has sha256 %s, the appliance disk %s", got, want)
	}
	var rec recovery.Record
	b, _ = os.ReadFile(filepath.Join(mnt, recovery.RecordFile))
	if err := json.Unmarshal(b, &rec); err != nil || rec.SHA256 != "sha256:"+sha256File(t, disk) || !rec.Unattended {
		t.Fatalf("record %s: %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(mnt, recovery.AgentBinary)); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("agent on the stick: %v %v", fi, err)
	}

	// The agent as the stick runs it, on a target larger than the disk.
	fi, _ = os.Stat(disk)
	target, _ := loopDevice(t, fi.Size()+16<<20)
	out = mustKiln(t, f, "agent", "reflash", "--no-poweroff", "--candidate", target, mnt)
	if !strings.Contains(out, "done — remove the stick and power on") {
		t.Fatalf("agent reflash:\n%s", out)
	}
	if out = mustKiln(t, f, "verify", target); !strings.Contains(out, "OK (exactly the bytes the build wrote)") {
		t.Fatalf("kiln verify %s after the reflash:\n%s", target, out)
	}
}

// Without --disk the stick builds the disk as kiln build does: its payload
// is byte for byte the disk kiln build writes for the same recipe and lock,
// and nothing of the build is left beside the stick.
func TestReflashStickFromRecipe(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	stick := filepath.Join(f.dir, "stick.raw")
	// No lock yet: written, as kiln build writes it.
	out := mustKiln(t, f, "reflash-stick", f.recipe, "-o", stick)
	for _, want := range []string{"wrote " + stick, "carrying the disk built from " + f.recipe, "stage image partition: started", "write image filesystem: done",
		"verify the appliance disk: done", "record the appliance disk: done", "write image filesystem (stick): done"} {
		if !strings.Contains(out, want) {
			t.Errorf("reflash-stick does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, ".kiln-reflash-") {
		t.Errorf("reflash-stick names its work directory:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "appliance.lock")); err != nil {
		t.Errorf("no lock written beside the recipe: %v", err)
	}
	assertNoWork(t, f.dir)
	if out := mustKiln(t, f, "verify", stick); !strings.Contains(out, "OK (exactly the bytes kiln reflash-stick wrote)") {
		t.Errorf("kiln verify %s:\n%s", stick, out)
	}
	disk := filepath.Join(f.dir, "appliance.raw")
	mustKiln(t, f, "build", f.recipe, "-o", disk)
	mnt := mountPartition(t, stick, recovery.PartitionName)
	if got, want := sha256File(t, filepath.Join(mnt, recovery.DiskFile)), sha256File(t, disk); got != want {
		t.Fatalf("the payload's disk has sha256 %s, kiln build's disk %s", got, want)
	}

	// Interrupted while building the disk, and while recording it: nothing
	// left, the previous stick untouched.
	prev := filepath.Join(f.dir, "prev-stick.raw")
	os.WriteFile(prev, []byte("previous disk"), 0o644)
	for _, step := range []string{"write image filesystem", "record "} {
		if code, log := interruptAt(t, f.cache, step, "reflash-stick", f.recipe, "-o", prev); code != 130 {
			t.Errorf("SIGINT when %q started: exit %d, want 130\n%s", step, code, log)
		}
		assertUntouched(t, f.dir, prev)
		assertNoWork(t, f.dir)
	}

	// A stale lock: kiln build's refusal, word for word.
	replaceInFile(t, f.recipe, "registry.example.com/acme/tool:0.1\n    source", "registry.example.com/acme/tool:0.2\n    source")
	want, code := kiln(t, f, "build", f.recipe, "-o", filepath.Join(f.dir, "stale.raw"))
	if code != 1 || !strings.Contains(want, "out of date") {
		t.Fatalf("kiln build with a stale lock: exit %d\n%s", code, want)
	}
	got, code := kiln(t, f, "reflash-stick", f.recipe, "-o", prev)
	if code != 1 || !strings.Contains(got, lastLine(want)) {
		t.Errorf("reflash-stick with a stale lock: exit %d, want 1 and kiln build's %q\n%s", code, lastLine(want), got)
	}
	assertUntouched(t, f.dir, prev)
	assertNoWork(t, f.dir)
}

// assertNoWork checks no reflash-stick work directory is left in dir.
func assertNoWork(t *testing.T, dir string) {
	t.Helper()
	if left, _ := filepath.Glob(filepath.Join(dir, ".kiln-reflash-*")); len(left) > 0 {
		t.Errorf("work directories left behind: %v", left)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func TestReflashStickRefuses(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	notDisk := filepath.Join(f.dir, "plain.raw")
	os.WriteFile(notDisk, []byte(strings.Repeat("not a disk ", 1000)), 0o644)
	stick := filepath.Join(f.dir, "stick.raw")
	os.WriteFile(stick, []byte("keep"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no output", []string{"reflash-stick", f.recipe, "--disk", notDisk}, 2, "-o STICK is needed"},
		{"build flags with a disk", []string{"reflash-stick", f.recipe, "--disk", notDisk, "--refresh-lock", "-o", stick}, 2, "only when reflash-stick builds the disk"},
		{"not a kiln disk", []string{"reflash-stick", f.recipe, "--disk", notDisk, "-o", stick}, 1, "not putting " + notDisk + " on a reflash stick"},
	} {
		out, code := kiln(t, f, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want %d with %q\n%s", tc.name, code, tc.code, tc.want, out)
		}
	}
	if b, _ := os.ReadFile(stick); string(b) != "keep" {
		t.Error("a refused run changed the output")
	}
}

// checkStickInspect: the summary line and kiln inspect say what the stick
// carries (the appliance, its disk's size and digest) and which agent.
func checkStickInspect(t *testing.T, f *fixture, stick, disk, summary string) {
	t.Helper()
	agentBin := filepath.Join(filepath.Dir(kilnBin), "kiln-agent")
	agent, self := kilnVersion(t, agentBin), kilnVersion(t, kilnBin)
	diskSum := "sha256:" + sha256File(t, disk)
	if want := "agent: " + agent.String() + ", " + fileBytes(t, agentBin); !strings.Contains(summary, want) || !strings.Contains(summary, "(test 1.0.0, ") {
		t.Errorf("the summary does not say the appliance and %q:\n%s", want, summary)
	}
	text := mustKiln(t, f, "inspect", stick)
	for _, want := range []string{
		"Reflash stick " + stick + ": ",
		"Carries: appliance test 1.0.0 (amd64), lock sha256:",
		"  built by " + self.String() + "\n",
		"  disk.raw: " + fileBytes(t, disk) + ", " + diskSum + ", disk GUID ",
		"Agent: " + agent.String() + ", " + fileBytes(t, agentBin) + ", sha256:" + sha256File(t, agentBin)[:12] + "\n",
		"Made by: " + self.String() + "\n",
		"Writes: the one non-removable disk that is neither the stick nor mounted; unattended: writes without asking\n",
		servedRef,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect of the stick lacks %q:\n%s", want, text)
		}
	}
	var rep reflashstick.Report
	if err := json.Unmarshal([]byte(mustKiln(t, f, "inspect", "-o", "json", stick)), &rep); err != nil {
		t.Fatal(err)
	}
	if c := rep.Disk.Contents; c == nil || c.Recipe != "test" || c.Version != "1.0.0" || rep.Disk.SHA256 != diskSum ||
		rep.Agent.Digest != "sha256:"+sha256File(t, agentBin) || rep.Agent.Version == nil || *rep.Agent.Version != agent || !rep.Unattended {
		t.Errorf("inspect -o json of the stick: %+v", rep)
	}
}
