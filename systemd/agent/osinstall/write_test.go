package osinstall

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/bundle"
	pbase "github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"github.com/kiln-appliance/kiln/test/kilnbin"
)

// osReleases are two releases of an appliance on A/B bases whose /usr share
// 2 MiB, bundled by the factory: 1.0 full, 1.1 a delta from it.
type osReleases struct {
	dir         string
	base10      string // 1.0's base, which the node's disk was built on
	b10, b11    string // the bundles
	rootHash10  string
	agentDigest string
	kernel      []byte // both releases boot it
}

func makeOSReleases(t *testing.T) *osReleases {
	t.Helper()
	dir := t.TempDir()
	agent := filepath.Join(dir, "kiln-agent")
	if err := kilnbin.Build(kilnbin.Node, agent); err != nil {
		t.Fatal(err)
	}
	rs := &osReleases{dir: dir, kernel: bytes.Repeat([]byte("kernel "), 4096)}
	shared := make([]byte, 2<<20)
	rand.New(rand.NewSource(1)).Read(shared)
	priv, pub, err := bundlefmt.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "factory.key")
	os.WriteFile(key, priv, 0o600)
	os.WriteFile(filepath.Join(dir, "factory.pub"), pub, 0o644)
	layout := filepath.Join(dir, "oci")
	if _, err := layers.Random(layout, "quay.io/acme/app:1", 1, 1, 64<<10); err != nil {
		t.Fatal(err)
	}
	var prev string
	for _, v := range []string{"1.0", "1.1"} {
		base := filepath.Join(dir, "ab-"+v+".raw")
		o := basedisk.OS{Version: v, Kernel: rs.kernel, Initrd: []byte("initrd " + v), Usr: map[string][]byte{"lib/shared.bin": shared, "lib/os-release": []byte("VERSION=" + v + "\n")}}
		if err := basedisk.Write(base, basedisk.WithABSlotsOS(8<<20, 8<<20, o)); err != nil {
			t.Fatal(err)
		}
		recipe := filepath.Join(dir, v, "appliance.yaml")
		os.MkdirAll(filepath.Dir(recipe), 0o755)
		os.WriteFile(recipe, fmt.Appendf(nil, `apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: acme
version: %s.0
arch: amd64
base:
  path: %s
images:
  - name: quay.io/acme/app:1
    source: oci:%s:quay.io/acme/app:1
trust: [%s]
`, v, base, layout, filepath.Join(dir, "factory.pub")), 0o644)
		r, err := recipes.Load(recipe)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := builder.EnsureLock(context.Background(), r, builder.LockOptions{}, io.Discard); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "upgrade-"+v+".img")
		o2 := bundle.Options{Output: out, Key: key, Agent: agent, CacheDir: filepath.Join(dir, "cache")}
		if prev != "" {
			o2.From = []string{prev}
		}
		res, err := bundle.Write(context.Background(), recipe, o2)
		if err != nil {
			t.Fatal(err)
		}
		if v == "1.0" {
			rs.base10, rs.b10, rs.rootHash10, rs.agentDigest = base, out, res.Manifest.OS.Usr.Verity.RootHash, res.Manifest.Agent.Digest
		} else {
			rs.b11 = out
		}
		prev = out
	}
	return rs
}

// node is a node that the factory made from 1.0's disk, booted from slot
// a: its slot partitions (files under by-partuuid, usrB bytes for slot b),
// its ESP with 1.0's entry and boot files, its kernel command line.
func (rs *osReleases) node(t *testing.T, usrB int64) Node {
	t.Helper()
	root := t.TempDir()
	d, err := pbase.OpenDisk(rs.base10, t.TempDir())
	if err != nil || !d.Raw {
		t.Fatalf("the base: %v", err)
	}
	defer d.Close()
	l := d.Layout
	slots, entry, err := osslots.ReadBoot(d)
	if err != nil || slots == nil {
		t.Fatalf("the base's slots: %v", err)
	}
	disk, err := os.ReadFile(rs.base10)
	if err != nil {
		t.Fatal(err)
	}
	n := Node{Root: root, ESP: "/efi", Slots: slots, Entry: entry.ID, PartitionAgent: rs.agentDigest,
		Base: contract.ReleaseID{Version: "1.0.0"}}
	for _, p := range l.Partitions {
		var b []byte
		switch strings.ToLower(p.GUID) {
		case slots.Slots[0].Usr.PartUUID, slots.Slots[0].UsrVerity.PartUUID:
			b = disk[p.Offset : p.Offset+p.Size]
		case slots.Slots[1].Usr.PartUUID:
			b = make([]byte, usrB)
		case slots.Slots[1].UsrVerity.PartUUID:
			b = make([]byte, p.Size)
		default:
			continue
		}
		writeFile(t, filepath.Join(root, ByPartUUID, strings.ToLower(p.GUID)), b)
	}
	files := append([]string{entry.Linux}, entry.Initrd...)
	copies, err := osslots.CopyFromESP(d, t.TempDir(), append(files, "/loader/entries/"+entry.ID+".conf"))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range append(files, "/loader/entries/"+entry.ID+".conf") {
		b, _ := os.ReadFile(copies[i])
		writeFile(t, filepath.Join(n.esp(), p), b)
	}
	writeFile(t, n.path(Cmdline), []byte(strings.Join(entry.Options, " ")+"\n"))
	return n
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// open reads a bundle's manifest and where its filesystem starts.
func open(t *testing.T, p string) (*bundlefmt.Manifest, *os.File, int64) {
	t.Helper()
	rep, err := bundle.Inspect(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return rep.Manifest, f, rep.Offset + rep.Header
}

func TestPrepareWrite(t *testing.T) {
	rs := makeOSReleases(t)

	t.Run("the release the node runs: nothing to write", func(t *testing.T) {
		n := rs.node(t, 8<<20)
		m, f, off := open(t, rs.b10)
		p, err := Prepare(n, m, f, off)
		if err != nil {
			t.Fatal(err)
		}
		if p.WritesSlot || !p.Unchanged {
			t.Fatalf("plan: slot %v, unchanged %v; want nothing written", p.WritesSlot, p.Unchanged)
		}
		before := espFiles(t, n)
		if err := p.Write(context.Background()); err != nil {
			t.Fatal(err)
		}
		if after := espFiles(t, n); after != before {
			t.Errorf("Write of an unchanged OS changed the ESP:\n%s\nto\n%s", before, after)
		}
	})

	t.Run("1.1 into slot b", func(t *testing.T) {
		n := rs.node(t, 8<<20)
		// An older release's entry still boots slot b: it goes before a
		// byte of the slot is written, with the kernel only it boots.
		stale := "/loader/entries/kiln-0.9.conf"
		writeFile(t, filepath.Join(n.esp(), stale), []byte("title old\nversion 0.9\nlinux /kiln/0.9/vmlinuz\noptions "+
			booting(t, strings.Repeat("9", 64), n.Slots.Slots[1].Usr.PartUUID, n.Slots.Slots[1].UsrVerity.PartUUID)+"\n"))
		writeFile(t, filepath.Join(n.esp(), "/kiln/0.9/vmlinuz"), []byte("old kernel"))
		m, f, off := open(t, rs.b11)
		p, err := Prepare(n, m, f, off)
		if err != nil {
			t.Fatal(err)
		}
		if !p.WritesSlot || p.Unchanged || p.OS.Slot != contract.SlotB || p.OS.RootHash != m.OS.Usr.Verity.RootHash || p.OS.Entry != contract.EntryID("1.1.0") {
			t.Fatalf("plan: slot %v, unchanged %v, OS %+v", p.WritesSlot, p.Unchanged, p.OS)
		}
		if !strings.Contains(strings.Join(p.OS.Options, " "), "systemd.verity_usr_data=PARTUUID="+n.Slots.Slots[1].Usr.PartUUID) {
			t.Errorf("the entry does not mount slot b: %v", p.OS.Options)
		}
		if p.OS.Linux != bootloader.BootFilePath(m.OS.Entry.Kernel.Digest) {
			t.Errorf("the entry boots %s, want the kernel by digest", p.OS.Linux)
		}
		var log bytes.Buffer
		var steps []string
		if err := p.Write(context.Background(), WithLog(&log), WithStepHook(func(s string) { steps = append(steps, s) })); err != nil {
			t.Fatalf("Write: %v\n%s", err, log.String())
		}
		for _, gone := range []string{stale, "/kiln/0.9/vmlinuz"} {
			if _, err := os.Stat(filepath.Join(n.esp(), gone)); err == nil {
				t.Errorf("%s, which only booted slot b, is still on the ESP", gone)
			}
		}
		for _, want := range []string{"os: boot entry kiln-0.9.conf removed (and 1 boot file(s) no other entry boots): it booted slot b", "os: writing ", "2.0 MiB from the active slot", "os: slot b proven: dm-verity root hash " + m.OS.Usr.Verity.RootHash + ", as signed", "initrd.img"} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("the log lacks %q:\n%s", want, log.String())
			}
		}
		if want := "remove entries,mark,write slot,half the slot written,seal"; !strings.HasPrefix(strings.Join(steps, ","), want) {
			t.Errorf("steps %v, want %s first", steps, want)
		}
		// Slot b holds 1.1's slot image, as a build from 1.1's base would.
		base11 := strings.Replace(rs.base10, "ab-1.0", "ab-1.1", 1)
		got, _ := os.ReadFile(n.device(n.Slots.Slots[1].Usr))
		want := slotA(t, base11, m.OS.Usr.Size)
		if !bytes.Equal(got[:len(want)], want) {
			t.Error("slot b does not hold 1.1's slot image")
		}
		for _, bf := range append([]bundlefmt.BootFile{m.OS.Entry.Kernel}, m.OS.Entry.Initrd...) {
			if ok, err := bootloader.HasBootFile(n.esp(), bf.Digest); err != nil || !ok {
				t.Errorf("%s %s is not on the ESP: %v", bf.Name, bf.Digest, err)
			}
		}
		// 1.0's entry boots slot a, and stays.
		if _, ok, _ := bootloader.Find(n.esp(), n.Entry); !ok {
			t.Error("Write removed the running release's entry")
		}
		// Again: resumes, keeping what is in place.
		log.Reset()
		if err := p.Write(context.Background(), WithLog(&log)); err != nil || !strings.Contains(log.String(), "keeping what an earlier import wrote") {
			t.Errorf("Write again: %v\n%s", err, log.String())
		}
	})

	t.Run("a slot too small", func(t *testing.T) {
		n := rs.node(t, 1<<20)
		m, f, off := open(t, rs.b11)
		_, err := Prepare(n, m, f, off)
		if err == nil || !strings.Contains(err.Error(), `the release's usr slot image is`) || !strings.Contains(err.Error(), `this node's "usr-b" (slot b) holds 1.0 MiB`) {
			t.Fatalf("Prepare on a node with a small slot b = %v", err)
		}
	})
}

// slotA is the first size bytes of the base's usr-a partition.
func slotA(t *testing.T, base string, size int64) []byte {
	t.Helper()
	l, err := gpt.Inspect(base)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := l.Find("usr-a")
	if !ok {
		t.Fatal("no usr-a")
	}
	f, _ := os.Open(base)
	defer f.Close()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, p.Offset); err != nil {
		t.Fatal(err)
	}
	return b
}

// espFiles lists the ESP's files with their digests.
func espFiles(t *testing.T, n Node) string {
	t.Helper()
	var out []string
	filepath.Walk(n.esp(), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			b, _ := os.ReadFile(p)
			out = append(out, fmt.Sprintf("%s %x", strings.TrimPrefix(p, n.esp()), sha256.Sum256(b)))
		}
		return nil
	})
	return strings.Join(out, "\n")
}
