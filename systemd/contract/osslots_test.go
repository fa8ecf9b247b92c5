package contract

import (
	"bytes"
	"strings"
	"testing"
)

func abSlots() *OSSlots {
	part := func(name, uuid string, size int64) SlotPartition {
		return SlotPartition{Name: name, PartUUID: uuid, Size: size}
	}
	return &OSSlots{
		Arch: "amd64",
		Slots: [2]OSSlot{
			{Name: SlotA, Usr: part("usr-a", "6b696c6e-6532-4500-8000-000000000011", 256<<20),
				UsrVerity: part("usr-a-verity", "6b696c6e-6532-4500-8000-000000000012", 5<<20)},
			{Name: SlotB, Usr: part("usr-b", "6b696c6e-6532-4500-8000-000000000021", 256<<20),
				UsrVerity: part("usr-b-verity", "6b696c6e-6532-4500-8000-000000000022", 5<<20)},
		},
		Active: SlotA, Entry: "kiln-1.0", RootHash: strings.Repeat("ab", 32),
	}
}

func TestOSSlotsCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*OSSlots)
		want string // "" = valid
	}{
		{"the A/B base's", func(*OSSlots) {}, ""},
		{"B larger", func(s *OSSlots) { s.Slots[1].Usr.Size *= 2 }, ""},
		{"B active", func(s *OSSlots) { s.Active = SlotB }, ""},
		{"B smaller", func(s *OSSlots) { s.Slots[1].Usr.Size -= 1 << 20 }, `"usr-b" (255.0 MiB) is smaller than "usr-a" (256.0 MiB)`},
		{"B's verity smaller", func(s *OSSlots) { s.Slots[1].UsrVerity.Size -= 1 << 20 }, `"usr-b-verity" (4.0 MiB) is smaller than "usr-a-verity"`},
		{"slots swapped", func(s *OSSlots) { s.Slots[0], s.Slots[1] = s.Slots[1], s.Slots[0] }, `slot 1 is named "b"`},
		{"upper-case PARTUUID", func(s *OSSlots) { s.Slots[0].Usr.PartUUID = strings.ToUpper(s.Slots[0].Usr.PartUUID) }, "not a lower-case UUID"},
		{"one partition twice", func(s *OSSlots) { s.Slots[1].Usr.PartUUID = s.Slots[0].Usr.PartUUID }, `"usr-a" and "usr-b" have the same PARTUUID`},
		{"no size", func(s *OSSlots) { s.Slots[0].UsrVerity.Size = 0 }, `"usr-a-verity": size 0`},
		{"no active slot", func(s *OSSlots) { s.Active = "" }, "active slot"},
		{"no entry", func(s *OSSlots) { s.Entry = "" }, "boot entry ID"},
		{"short root hash", func(s *OSSlots) { s.RootHash = "abcd" }, "64 lower-case hex"},
		{"other arch", func(s *OSSlots) { s.Arch = "riscv64" }, `arch "riscv64"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := abSlots()
			tc.edit(s)
			err := s.Check()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Check() = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestContentsOSSlots: kiln.json carries the slots and reads them back; a
// disk without slots has no osSlots key at all (its kiln.json is as before
// slots existed), and slots that fail Check are refused on reading.
func TestContentsOSSlots(t *testing.T) {
	c := Contents{SchemaVersion: ContentsVersion, Recipe: "r", Version: "1.0", Arch: "amd64"}
	var b bytes.Buffer
	if err := c.Encode(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "osSlots") {
		t.Errorf("kiln.json without slots names them:\n%s", b.String())
	}
	c.OSSlots = abSlots()
	b.Reset()
	if err := c.Encode(&b); err != nil {
		t.Fatal(err)
	}
	got, err := Decode(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if *got.OSSlots != *c.OSSlots {
		t.Errorf("read back %+v, want %+v", got.OSSlots, c.OSSlots)
	}
	bad := strings.Replace(b.String(), `"active": "a"`, `"active": "c"`, 1)
	if _, err := Decode(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), `kiln.json: OS slots: active slot "c"`) {
		t.Errorf("bad slots: %v", err)
	}
}
