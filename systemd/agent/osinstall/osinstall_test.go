package osinstall

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

const (
	usrA, verityA = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
	usrB, verityB = "33333333-3333-4333-8333-333333333333", "44444444-4444-4444-8444-444444444444"
)

var hashA = strings.Repeat("a", 64)

func slots() *contract.OSSlots {
	return &contract.OSSlots{Arch: "amd64", Active: contract.SlotA, RootHash: hashA, Slots: [2]contract.OSSlot{
		{Name: contract.SlotA, Usr: contract.SlotPartition{Name: "usr-a", PartUUID: usrA}, UsrVerity: contract.SlotPartition{Name: "usr-a-verity", PartUUID: verityA}},
		{Name: contract.SlotB, Usr: contract.SlotPartition{Name: "usr-b", PartUUID: usrB}, UsrVerity: contract.SlotPartition{Name: "usr-b-verity", PartUUID: verityB}},
	}}
}

// booting is the kernel command line of an entry mounting /usr from data
// and hash with root hash h, as bootentry writes it.
func booting(t *testing.T, h, data, hash string) string {
	t.Helper()
	o, err := bootentry.UsrVerity{RootHash: h, DataPartUUID: data, HashPartUUID: hash, FSType: "erofs"}.Options()
	if err != nil {
		t.Fatal(err)
	}
	return "root=LABEL=root " + strings.Join(o, " ") + " rw"
}

// nodeWith is a node tree whose kernel was booted with cmdline ("": none).
func nodeWith(t *testing.T, cmdline string) Node {
	t.Helper()
	n := Node{Root: t.TempDir(), ESP: "/efi", Slots: slots()}
	if cmdline != "" {
		p := n.path(Cmdline)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(cmdline+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// Booted reads the active slot from the kernel command line, never from a
// guess, and refuses a command line that does not match kiln.json's slots.
func TestBooted(t *testing.T) {
	hashB := strings.Repeat("b", 64)
	for _, tc := range []struct {
		name     string
		cmdline  string
		noSlots  bool
		slot     string
		rootHash string
		err      string
	}{
		{name: "slot a", cmdline: booting(t, hashA, usrA, verityA), slot: contract.SlotA, rootHash: hashA},
		{name: "slot b", cmdline: booting(t, hashB, usrB, verityB), slot: contract.SlotB, rootHash: hashB},
		{name: "upper case PARTUUIDs", cmdline: booting(t, hashB, strings.ToUpper(usrB), strings.ToUpper(verityB)), slot: contract.SlotB, rootHash: hashB},
		{name: "no slots", noSlots: true, err: ErrNoSlots.Error()},
		{name: "no command line", err: "the booted slot: open "},
		{name: "not from a slot", cmdline: "root=LABEL=root rw", err: "the kernel command line names no usr slot (usrhash=, systemd.verity_usr_data=): this boot did not mount /usr from a slot"},
		{name: "half the parameters", cmdline: "usrhash=" + hashA, err: "the booted slot: kernel command line: usr partitions"},
		{name: "a's data with b's hash tree", cmdline: booting(t, hashA, usrA, verityB), err: "/usr is usr-a (slot a) but its hash tree is PARTUUID " + verityB + ", not " + verityA},
		{name: "a partition of neither slot", cmdline: booting(t, hashA, verityA, usrA), err: "/usr is PARTUUID " + verityA + ", which is neither of kiln.json's slots (" + usrA + ", " + usrB + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := nodeWith(t, tc.cmdline)
			if tc.noSlots {
				n.Slots = nil
			}
			s, h, err := n.Booted()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Booted = %s, %s, %v; want an error containing %q", s.Name, h, err, tc.err)
				}
				if tc.noSlots != errors.Is(err, ErrNoSlots) {
					t.Errorf("errors.Is(%v, ErrNoSlots) = %v", err, !tc.noSlots)
				}
				return
			}
			if err != nil || s.Name != tc.slot || h != tc.rootHash {
				t.Fatalf("Booted = %s, %s, %v; want %s, %s", s.Name, h, err, tc.slot, tc.rootHash)
			}
		})
	}
}

// Prepare refuses, before reading the bundle's OS, a node that cannot take
// it, and says what to do instead.
func TestPrepareRefuses(t *testing.T) {
	withOS := func(arch string) *bundlefmt.Manifest {
		return &bundlefmt.Manifest{Version: "1.1.0", Arch: arch, OS: &bundlefmt.OS{Usr: bundlefmt.UsrSlot{Index: "sha256:" + strings.Repeat("c", 64)}}}
	}
	for _, tc := range []struct {
		name    string
		m       *bundlefmt.Manifest
		noSlots bool
		cmdline string
		err     string
	}{
		{name: "no OS section", m: &bundlefmt.Manifest{Version: "1.1.0", Arch: "amd64"}, err: "the bundle has no OS section"},
		{name: "a node without slots", m: withOS("amd64"), noSlots: true,
			err: "this node has no OS slots (its factory disk was built on a base without usr slots), and bundle 1.1.0 brings an OS: reflash the node with a disk built on an A/B base"},
		{name: "another arch", m: withOS("arm64"), err: "the bundle's OS is for arm64; this node's usr slots are amd64 partitions: use a bundle made for amd64"},
		{name: "the booted slot unknown", m: withOS("amd64"), cmdline: "root=LABEL=root", err: "names no usr slot"},
		{name: "the slot index not in the bundle", m: withOS("amd64"), cmdline: booting(t, hashA, usrA, verityA), err: "bundle is damaged: slot index sha256:" + strings.Repeat("c", 64) + " is not a file of the bundle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := nodeWith(t, tc.cmdline)
			if tc.noSlots {
				n.Slots = nil
			}
			p, err := Prepare(n, tc.m, strings.NewReader(""), 0)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Prepare = %+v, %v; want an error containing %q", p, err, tc.err)
			}
			if tc.noSlots && !errors.Is(err, ErrNoSlots) {
				t.Errorf("%v is not ErrNoSlots", err)
			}
		})
	}
}

func TestOther(t *testing.T) {
	s := slots()
	if got := other(s, s.Slots[0]); got.Name != contract.SlotB {
		t.Errorf("other than a: %s", got.Name)
	}
	if got := other(s, s.Slots[1]); got.Name != contract.SlotA {
		t.Errorf("other than b: %s", got.Name)
	}
}
