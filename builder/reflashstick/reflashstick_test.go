package reflashstick

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"github.com/kiln-appliance/kiln/test/kilnbin"
	"github.com/kiln-appliance/kiln/test/loopmount"
)

// agentBin is the node edition of kiln, built once: the stick runs it.
var agentBin string

func TestMain(m *testing.M) { kilnbin.RunWithAgent(m, &agentBin) }

// appliance is a recipe, generated inputs for it, and the disk kiln built
// from it.
type appliance struct {
	dir, cache, recipe, disk string
	guid                     string
}

const recipeTemplate = `apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: test
version: %s
arch: amd64
base:
  path: %s
images:
  - name: quay.io/acme/app:1
    source: oci:%s:quay.io/acme/app:1
reflash:
  target:
    path: /dev/disk/by-path/pci-0000:00:17.0-ata-1
    minSize: 1MiB
`

func newAppliance(t *testing.T) *appliance {
	t.Helper()
	dir := t.TempDir()
	a := &appliance{dir: dir, cache: filepath.Join(dir, "cache"), disk: filepath.Join(dir, "appliance.raw")}
	if err := basedisk.Write(filepath.Join(dir, "base.raw")); err != nil {
		t.Fatal(err)
	}
	if _, err := layers.Random(filepath.Join(dir, "oci"), "quay.io/acme/app:1", 1, 2, 64<<10); err != nil {
		t.Fatal(err)
	}
	a.recipe = a.writeRecipe(t, "1.0.0")
	res, err := builder.Build(context.Background(), a.recipe, builder.Options{Output: a.disk, CacheDir: a.cache, Agent: agentBin})
	if err != nil {
		t.Fatal(err)
	}
	a.guid = res.Layout.GUID
	return a
}

// writeRecipe writes the recipe of release version in its own directory.
func (a *appliance) writeRecipe(t *testing.T, version string) string {
	t.Helper()
	d := filepath.Join(a.dir, version)
	os.MkdirAll(d, 0o755)
	p := filepath.Join(d, "appliance.yaml")
	y := fmt.Sprintf(recipeTemplate, version, filepath.Join(a.dir, "base.raw"), filepath.Join(a.dir, "oci"))
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (a *appliance) options(out string) Options {
	return Options{Disk: a.disk, Output: out, Agent: agentBin, Build: builder.Options{CacheDir: a.cache}}
}

// The stick carries exactly the disk, its record and the agent, and
// Inspect reads back what Write wrote.
func TestWriteInspect(t *testing.T) {
	a := newAppliance(t)
	for _, unattended := range []bool{false, true} {
		t.Run(fmt.Sprintf("unattended=%v", unattended), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "stick.raw")
			o := a.options(out)
			o.Unattended = unattended
			res, err := Write(context.Background(), a.recipe, o)
			if err != nil {
				t.Fatal(err)
			}
			diskSum, diskSize := sha256File(t, a.disk)
			agentSum, agentSize := sha256File(t, agentBin)
			if res.Built || res.Record.SHA256 != diskSum || res.Record.Size != diskSize || res.AgentSize != agentSize {
				t.Errorf("Result: built %v, record %s (%d bytes), agent %d bytes", res.Built, res.Record.SHA256, res.Record.Size, res.AgentSize)
			}

			rep, err := Inspect(out)
			if err != nil {
				t.Fatal(err)
			}
			want := recovery.Target{Path: "/dev/disk/by-path/pci-0000:00:17.0-ata-1", MinSize: 1 << 20}
			switch {
			case rep.Disk.SHA256 != diskSum || rep.Disk.Size != diskSize || rep.Disk.DiskGUID != a.guid:
				t.Errorf("Inspect's disk %+v, want %s, %d bytes, GUID %s", rep.Disk, diskSum, diskSize, a.guid)
			case rep.Disk.Contents == nil || rep.Disk.Contents.Recipe != "test" || rep.Disk.Contents.Version != "1.0.0":
				t.Errorf("Inspect's disk contents %+v", rep.Disk.Contents)
			case rep.Agent.Digest != agentSum || rep.Agent.Size != agentSize || rep.Agent.Version == nil || rep.Kiln == nil:
				t.Errorf("Inspect's agent %+v, kiln %v; want %s, %d bytes", rep.Agent, rep.Kiln, agentSum, agentSize)
			case rep.Target != want || rep.Unattended != unattended:
				t.Errorf("Inspect: target %+v, unattended %v; want %+v, %v", rep.Target, rep.Unattended, want, unattended)
			case rep.Layout.Size != res.Layout.Size:
				t.Errorf("Inspect's layout is %d bytes, Write's %d", rep.Layout.Size, res.Layout.Size)
			}
			if v, err := exec.Command("sgdisk", "-v", out).CombinedOutput(); err != nil || !strings.Contains(string(v), "No problems found") {
				t.Errorf("sgdisk -v: %v\n%s", err, v)
			}

			// The payload, read by the kernel: the disk byte for byte, the
			// record's chunks, the agent.
			p, _ := payload(rep.Layout)
			mnt := loopmount.Squashfs(t, out, p.Offset, p.Size)
			if got, _ := sha256File(t, filepath.Join(mnt, recovery.DiskFile)); got != diskSum {
				t.Errorf("the payload's disk is %s, the appliance disk %s", got, diskSum)
			}
			var rec recovery.Record
			b, _ := os.ReadFile(filepath.Join(mnt, recovery.RecordFile))
			if err := json.Unmarshal(b, &rec); err != nil || len(rec.Chunks) != int((diskSize+recovery.ChunkSize-1)/recovery.ChunkSize) {
				t.Errorf("record: %v, %d chunks for %d bytes", err, len(rec.Chunks), diskSize)
			}
			if got, _ := sha256File(t, filepath.Join(mnt, recovery.AgentBinary)); got != agentSum {
				t.Errorf("the payload's agent is %s, want %s", got, agentSum)
			}
		})
	}
}

// Write refuses what is not this recipe's whole disk, and anything else
// wrong, leaving no output and an existing one as it was.
func TestWriteRefuses(t *testing.T) {
	a := newAppliance(t)
	damaged := filepath.Join(a.dir, "damaged.raw")
	if out, err := exec.Command("cp", "--sparse=always", a.disk, damaged).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	fi, _ := os.Stat(damaged)
	flip(t, damaged, fi.Size()/2)
	r101 := a.writeRecipe(t, "1.0.1")
	notKiln := filepath.Join(a.dir, "not-kiln")
	os.WriteFile(notKiln, []byte("#!/bin/sh\n"), 0o755)

	for _, tc := range []struct {
		name   string
		recipe string
		change func(o *Options)
		want   string
	}{
		{"another release's disk", r101, nil, a.disk + " is appliance test 1.0.0, the recipe " + r101 + " is test 1.0.1: give the disk built from this recipe"},
		{"a damaged disk", a.recipe, func(o *Options) { o.Disk = damaged }, "not putting " + damaged + " on a reflash stick: "},
		{"a missing disk", a.recipe, func(o *Options) { o.Disk = filepath.Join(a.dir, "missing.raw") }, "missing.raw"},
		{"the disk as the output", a.recipe, func(o *Options) { o.Output = a.disk }, a.disk},
		{"an agent that is not kiln", a.recipe, func(o *Options) { o.Agent = notKiln }, "agent binary " + notKiln + ": not a Linux executable"},
		{"a missing recipe", filepath.Join(a.dir, "missing.yaml"), nil, "missing.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "stick.raw")
			os.WriteFile(out, []byte("the stick before"), 0o644)
			o := a.options(out)
			if tc.change != nil {
				tc.change(&o)
			}
			before, _ := os.ReadFile(o.Output)
			_, err := Write(context.Background(), tc.recipe, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write = %v, want an error containing %q", err, tc.want)
			}
			if after, _ := os.ReadFile(o.Output); !bytes.Equal(before, after) {
				t.Errorf("a refused stick changed %s", o.Output)
			}
			entries, _ := os.ReadDir(filepath.Dir(out))
			if len(entries) != 1 {
				t.Errorf("a refused stick left %v beside its output", entries)
			}
		})
	}
}

// Inspect says what is not a stick, and a damaged payload is an error,
// never a panic.
func TestInspectRefuses(t *testing.T) {
	a := newAppliance(t)
	stick := filepath.Join(a.dir, "stick.raw")
	if _, err := Write(context.Background(), a.recipe, a.options(stick)); err != nil {
		t.Fatal(err)
	}
	rep, err := Inspect(stick)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := payload(rep.Layout)
	junk := filepath.Join(a.dir, "junk")
	os.WriteFile(junk, make([]byte, 1<<20), 0o644)
	damaged := filepath.Join(a.dir, "damaged-stick.raw")
	if out, err := exec.Command("cp", "--sparse=always", stick, damaged).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	f, _ := os.OpenFile(damaged, os.O_RDWR, 0)
	f.WriteAt(bytes.Repeat([]byte{0xa5}, 4096), p.Offset) // the payload's superblock
	f.Close()

	// The record, stored uncompressed in the payload, made unreadable.
	badRecord := filepath.Join(a.dir, "bad-record.raw")
	if out, err := exec.Command("cp", "--sparse=always", stick, badRecord).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	part := make([]byte, p.Size)
	f, _ = os.OpenFile(badRecord, os.O_RDWR, 0)
	f.ReadAt(part, p.Offset)
	i := bytes.Index(part, []byte(`{"size":`))
	if i < 0 {
		t.Fatal("no record in the payload")
	}
	f.WriteAt([]byte("#"), p.Offset+int64(i))
	f.Close()

	for _, tc := range []struct{ name, path, want string }{
		{"an unreadable record", badRecord, badRecord + ": " + recovery.RecordFile + ": "},
		{"a disk, not a stick", a.disk, a.disk + " has no " + recovery.PartitionName + " partition: not a reflash stick"},
		{"not a disk", junk, junk},
		{"a damaged payload", damaged, damaged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if rep, err := Inspect(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Inspect = %+v, %v; want an error containing %q", rep, err, tc.want)
			}
		})
	}
}

// The staging copy keeps the disk's holes and its bytes.
func TestSparseWriter(t *testing.T) {
	const block = 1 << 20
	data := make([]byte, 4*block)
	copy(data[block:], bytes.Repeat([]byte("x"), block))
	data[4*block-1] = 1
	p := filepath.Join(t.TempDir(), "copy")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w := &sparseWriter{f: f}
	for off := 0; off < len(data); off += block {
		if n, err := w.Write(data[off : off+block]); err != nil || n != block {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	f.Close()
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, data) {
		t.Fatal("the copy differs")
	}
	fi, _ := os.Stat(p)
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 3*block {
		t.Errorf("the copy uses %d bytes for 2 MiB of data: the zeros were written", used)
	}
}

func sha256File(t *testing.T, p string) (string, int64) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n
}

func flip(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	f.ReadAt(b, off)
	b[0] ^= 0xff
	f.WriteAt(b, off)
}
