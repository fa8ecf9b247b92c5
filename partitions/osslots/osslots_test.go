package osslots

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// part is a partition of a test disk: an sgdisk type code, a GPT name, MiB.
type part struct {
	code, name string
	mib        int
}

// uuid is partition n's PARTUUID on a test disk.
func uuid(n int) string { return fmt.Sprintf("6b696c6e-0000-4000-8000-%012d", n) }

const rootHash = "b2e4228ca6fb34ff3dbf3e8ddd0fe4ad4a1eac87cf737b97295d7d321a118471"

// disk writes a sparse disk with parts (sgdisk, checked by sgdisk -v) and,
// when the first is an ESP, a FAT filesystem on it holding entries in
// loader/entries (mkfs.fat, mtools).
func disk(t *testing.T, parts []part, entries map[string]string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.raw")
	size := 2
	args := []string{"-o"}
	for i, pt := range parts {
		n := strconv.Itoa(i + 1)
		args = append(args, "-n", n+":0:+"+strconv.Itoa(pt.mib)+"M", "-t", n+":"+pt.code, "-c", n+":"+pt.name, "-u", n+":"+uuid(i+1))
		size += pt.mib
	}
	run(t, "truncate", "-s", strconv.Itoa(size)+"M", p)
	run(t, "sgdisk", append(args, p)...)
	if out := run(t, "sgdisk", "-v", p); !strings.Contains(out, "No problems found") {
		t.Fatalf("sgdisk -v: %s", out)
	}
	if parts[0].code != "EF00" {
		return p
	}
	// sgdisk aligns the first partition to 1 MiB.
	run(t, "mkfs.fat", "--invariant", "--offset", "2048", p, strconv.Itoa(parts[0].mib*1024))
	img := fmt.Sprintf("%s@@%d", p, 1<<20)
	run(t, "mmd", "-i", img, "::/loader", "::/"+bootentry.Dir)
	dir := t.TempDir()
	for name, text := range entries {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, "mcopy", "-i", img, f, "::/"+bootentry.Dir+"/"+name)
	}
	esp := filepath.Join(dir, "esp.fat")
	fixtures.CopyRange(t, p, 1<<20, int64(parts[0].mib)<<20, esp)
	run(t, "fsck.fat", "-n", esp)
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
	return string(out)
}

// entry is a release's entry booting the usr partition n with its verity
// partition n+1 (the disks' PARTUUIDs).
func entry(version string, n int, hash string) string {
	e := bootentry.Entry{ID: "x", Title: "appliance " + version, Version: version, Linux: "/vmlinuz",
		Options: []string{"root=LABEL=root", "rw"}}
	if n > 0 {
		usr, err := bootentry.UsrVerity{RootHash: hash, DataPartUUID: uuid(n), HashPartUUID: uuid(n + 1), FSType: "squashfs"}.Options()
		if err != nil {
			panic(err)
		}
		e.Options = append(e.Options, usr...)
	}
	var b strings.Builder
	if err := e.Encode(&b); err != nil {
		panic(err)
	}
	return b.String()
}

// The A/B base's layout (as the e2e fixture's, smaller): ESP, boot, usr-a,
// usr-a-verity, usr-b, usr-b-verity, root.
var ab = []part{{"EF00", "EFI-SYSTEM", 8}, {"8300", "boot", 1}, {"8314", "usr-a", 4}, {"8319", "usr-a-verity", 1},
	{"8314", "usr-b", 4}, {"8319", "usr-b-verity", 1}, {"8304", "root", 1}}

func with(ps []part, edit func([]part) []part) []part { return edit(append([]part(nil), ps...)) }

func TestRead(t *testing.T) {
	release := map[string]string{"kiln-1.0.conf": entry("1.0", 3, rootHash),
		"ignition-firstboot.conf": strings.Replace(entry("", 3, rootHash), "options ", "options ignition.firstboot ", 1)}
	want := &contract.OSSlots{Arch: "amd64", Active: contract.SlotA, Entry: "kiln-1.0", RootHash: rootHash,
		Slots: [2]contract.OSSlot{
			{Name: "a", Usr: contract.SlotPartition{Name: "usr-a", PartUUID: uuid(3), Size: 4 << 20},
				UsrVerity: contract.SlotPartition{Name: "usr-a-verity", PartUUID: uuid(4), Size: 1 << 20}},
			{Name: "b", Usr: contract.SlotPartition{Name: "usr-b", PartUUID: uuid(5), Size: 4 << 20},
				UsrVerity: contract.SlotPartition{Name: "usr-b-verity", PartUUID: uuid(6), Size: 1 << 20}},
		}}
	for _, tc := range []struct {
		name    string
		parts   []part
		entries map[string]string
		want    func(*contract.OSSlots) // nil: no slots
		err     string
	}{
		{name: "the A/B base", parts: ab, entries: release, want: func(*contract.OSSlots) {}},
		{name: "booted from B, counted entry", parts: ab, entries: map[string]string{"kiln-1.0+3-1.conf": entry("1.0", 5, rootHash)},
			want: func(s *contract.OSSlots) { s.Active = "b" }},
		{name: "arm64", parts: with(ab, func(ps []part) []part {
			ps[2].code, ps[3].code, ps[4].code, ps[5].code = "8316", "831b", "8316", "831b"
			return ps
		}), entries: release, want: func(s *contract.OSSlots) { s.Arch = "arm64" }},
		{name: "verity partitions after both usr, paired by name", parts: with(ab, func(ps []part) []part {
			ps[3], ps[4] = part{"8314", "usr-b", 4}, part{"8319", "usr-a-verity", 1}
			return ps
		}), entries: map[string]string{"kiln-1.0.conf": strings.Replace(entry("1.0", 3, rootHash), "PARTUUID="+uuid(4), "PARTUUID="+uuid(5), 1)},
			want: func(s *contract.OSSlots) {
				s.Slots[0].UsrVerity.PartUUID, s.Slots[1].Usr.PartUUID = uuid(5), uuid(4)
			}},
		{name: "B larger", parts: with(ab, func(ps []part) []part { ps[4].mib = 6; return ps }), entries: release,
			want: func(s *contract.OSSlots) { s.Slots[1].Usr.Size = 6 << 20 }},
		{name: "no usr partitions", parts: []part{{"EF00", "EFI-SYSTEM", 8}, {"8300", "boot", 1}, {"8304", "root", 1}}},

		{name: "one usr partition", parts: ab[:4],
			err: `the base has 1 usr partitions (3 "usr-a"), where A/B slots are two`},
		{name: "three usr partitions", parts: append(with(ab, func(ps []part) []part { return ps }), part{"8314", "usr-c", 4}, part{"8319", "usr-c-verity", 1}),
			err: `the base has 3 usr partitions (3 "usr-a", 5 "usr-b", 8 "usr-c")`},
		{name: "usr-b without verity", parts: with(ab, func(ps []part) []part { ps[5].code = "8300"; return ps }),
			err: `usr partition 5 "usr-b" has no usr-verity partition (its dm-verity hash tree, e.g. named "usr-b-verity"): the base has 1 usr-verity partitions (4 "usr-a-verity") for 2 usr partitions`},
		{name: "B smaller", parts: with(ab, func(ps []part) []part { ps[4].mib = 3; return ps }), entries: release,
			err: `OS slots: "usr-b" (3.0 MiB) is smaller than "usr-a" (4.0 MiB): slot B must hold any release slot A holds; make "usr-b" at least 4194304 bytes`},
		{name: "mixed arches", parts: with(ab, func(ps []part) []part { ps[4].code = "8316"; return ps }),
			err: `the base's usr partitions are for both amd64 and arm64 (partition 5 "usr-b")`},
		{name: "no entry mounts a slot", parts: ab, entries: map[string]string{"kiln-1.0.conf": entry("1.0", 0, "")},
			err: `the base has usr slots but no boot loader entry in loader/entries on its ESP (partition 1 "EFI-SYSTEM") mounts one`},
		{name: "no ESP", parts: ab[1:],
			err: "the base has usr slots and 0 EFI system partitions"},
		{name: "entries disagree", parts: ab, entries: map[string]string{"kiln-1.0.conf": entry("1.0", 3, rootHash), "old.conf": entry("", 3, strings.Repeat("0", 64))},
			err: "boot loader entries kiln-1.0.conf and old.conf boot different /usr"},
		{name: "two releases", parts: ab, entries: map[string]string{"kiln-1.0.conf": entry("1.0", 3, rootHash), "kiln-0.9.conf": entry("0.9", 3, rootHash)},
			err: "boot loader entries kiln-0.9, kiln-1.0 all have a version"},
		{name: "entry names a slot's usr with the other's verity", parts: ab,
			entries: map[string]string{"kiln-1.0.conf": strings.Replace(entry("1.0", 3, rootHash), "PARTUUID="+uuid(4), "PARTUUID="+uuid(6), 1)},
			err:     `boot loader entry kiln-1.0 mounts "usr-a" (PARTUUID ` + uuid(3) + `) with the hash tree of PARTUUID ` + uuid(6)},
		{name: "entry names no slot", parts: ab, entries: map[string]string{"kiln-1.0.conf": entry("1.0", 1, rootHash)},
			err: "boot loader entry kiln-1.0 mounts /usr from PARTUUID " + uuid(1) + ", which is neither slot's usr partition"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // sgdisk sleeps a second after writing
			p := disk(t, tc.parts, tc.entries)
			d, err := base.OpenDisk(p, t.TempDir())
			if err != nil || !d.Raw {
				t.Fatal(err)
			}
			defer d.Close()
			got, err := Read(d)
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Read = %+v, %v; want the error %q", got, err, tc.err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.want == nil:
				if got != nil {
					t.Errorf("Read = %+v, want no slots", got)
				}
			default:
				w := *want
				tc.want(&w)
				if got == nil || *got != w {
					t.Errorf("Read =\n%+v\nwant\n%+v", got, &w)
				}
			}
		})
	}
}

// TestReadCompressed: the entries of a compressed base are read from a copy
// of its ESP.
func TestReadCompressed(t *testing.T) {
	p := disk(t, ab, map[string]string{"kiln-1.0.conf": entry("1.0", 3, rootHash)})
	zst := p + ".zst"
	if err := basedisk.Compress(p, zst, "zstd"); err != nil {
		t.Fatal(err)
	}
	d, err := base.OpenDisk(zst, t.TempDir())
	if err != nil || d.Raw {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := Read(d)
	if err != nil || got == nil || got.RootHash != rootHash || got.Entry != "kiln-1.0" {
		t.Fatalf("Read = %+v, %v", got, err)
	}
}

// ReadBoot gives the release's entry, and CopyFromESP the files it names,
// from a raw base and from a compressed one alike; a file the entry names
// and the ESP lacks is said so.
func TestReadBootAndCopyFromESP(t *testing.T) {
	dir := t.TempDir()
	raw, zst := filepath.Join(dir, "ab.raw"), filepath.Join(dir, "ab.raw.zst")
	o := basedisk.OS{Version: "1.0", Usr: map[string][]byte{"lib/os-release": []byte("VERSION_ID=1.0\n")}, Kernel: []byte("kernel"), Initrd: []byte("initramfs")}
	if err := basedisk.Write(raw, basedisk.WithABSlotsOS(8<<20, 8<<20, o)); err != nil {
		t.Fatal(err)
	}
	if err := basedisk.Compress(raw, zst, "zstd"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{raw, zst} {
		d, err := base.OpenDisk(p, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		s, e, err := ReadBoot(d)
		if err != nil {
			t.Fatal(err)
		}
		if s.Entry != basedisk.ABEntry || e.ID != s.Entry || e.Version != "1.0" || e.Linux != "/kiln/1.0/vmlinuz" || len(e.Initrd) != 1 {
			t.Fatalf("%s: slots %+v, entry %+v", p, s, e)
		}
		out := t.TempDir()
		got, err := CopyFromESP(d, out, append([]string{e.Linux}, e.Initrd...))
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []string{"kernel", "initramfs"} {
			if b, _ := os.ReadFile(got[i]); string(b) != want {
				t.Errorf("%s: %s holds %q, want %q", p, got[i], b, want)
			}
		}
		if _, err := CopyFromESP(d, out, []string{"/kiln/1.0/missing"}); err == nil || !strings.Contains(err.Error(), "names /kiln/1.0/missing, which its ESP") {
			t.Errorf("%s: a missing file: %v", p, err)
		}
	}
}

func TestCheckArch(t *testing.T) {
	for _, tc := range []struct {
		slots *contract.OSSlots
		arch  string
		want  string // "" for no error
	}{
		{nil, "amd64", ""},
		{&contract.OSSlots{Arch: "amd64"}, "amd64", ""},
		{&contract.OSSlots{Arch: "arm64"}, "amd64", "its OS slots are for arm64 (usr partition types), the recipe's arch is amd64"},
	} {
		err := CheckArch(tc.slots, tc.arch)
		if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
			t.Errorf("CheckArch(%v, %s) = %v, want %q", tc.slots, tc.arch, err, tc.want)
		}
	}
}
