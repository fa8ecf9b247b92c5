package partitions

import (
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/gpt"
)

// coreOS is a CoreOS-shaped base: ESP, boot, then root last.
func coreOS(sector int) *gpt.Layout {
	return &gpt.Layout{SectorSize: sector, Partitions: []gpt.Partition{
		{Number: 1, Name: "EFI-SYSTEM", Offset: 1 * MiB, Size: 127 * MiB},
		{Number: 2, Name: "boot", Offset: 128 * MiB, Size: 384 * MiB},
		{Number: 3, Name: "root", Offset: 512 * MiB, Size: 1024 * MiB},
	}}
}

// rootFirst has root before boot: root cannot move.
func rootFirst() *gpt.Layout {
	return &gpt.Layout{SectorSize: 512, Partitions: []gpt.Partition{
		{Number: 1, Name: "root", Offset: 1 * MiB, Size: 100 * MiB},
		{Number: 2, Name: "boot", Offset: 101 * MiB, Size: 10*MiB + 512},
	}}
}

func TestGeometry(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		base                    *gpt.Layout
		place                   string
		fs                      int64
		headroom                int
		partSize, diskSize      int64
		start, part, root, disk int64 // want; root 0: root stays
		err                     string
	}{
		{name: "auto moves root", base: coreOS(512), fs: 100 * MiB, headroom: 10,
			start: 512 * MiB, part: 110 * MiB, root: 622 * MiB, disk: 1647 * MiB},
		{name: "before-root", base: coreOS(512), place: PlaceBeforeRoot, fs: 100 * MiB,
			start: 512 * MiB, part: 100 * MiB, root: 612 * MiB, disk: 1637 * MiB},
		{name: "end", base: coreOS(512), place: PlaceEnd, fs: 100 * MiB,
			start: 1536 * MiB, part: 100 * MiB, disk: 1637 * MiB},
		{name: "headroom rounds up to MiB", base: coreOS(512), place: PlaceEnd, fs: 100*MiB + 1, headroom: 0,
			start: 1536 * MiB, part: 101 * MiB, disk: 1638 * MiB},
		{name: "4Kn backup GPT", base: coreOS(4096), place: PlaceEnd, fs: MiB,
			start: 1536 * MiB, part: MiB, disk: 1538 * MiB},
		{name: "fixed partition", base: coreOS(512), place: PlaceEnd, fs: MiB, partSize: 64 * MiB,
			start: 1536 * MiB, part: 64 * MiB, disk: 1601 * MiB},
		{name: "fixed disk", base: coreOS(512), fs: MiB, diskSize: 8 << 30,
			start: 512 * MiB, part: MiB, root: 513 * MiB, disk: 8 << 30},
		{name: "auto keeps root when it is not last", base: rootFirst(), fs: MiB,
			start: 112 * MiB, part: MiB, disk: 114 * MiB},
		{name: "before-root but root is not last", base: rootFirst(), place: PlaceBeforeRoot, fs: MiB,
			err: `partition 2 "boot" lies after root`},
		{name: "unknown placement", base: coreOS(512), place: "middle", err: `placement "middle"`},
		{name: "partition smaller than the filesystem", base: coreOS(512), fs: 10 * MiB, partSize: 5 * MiB,
			err: "image partition size 5 MiB is too small: the image filesystem (with its verity tree and kiln's seal) needs 10 MiB"},
		{name: "disk smaller than the base", base: coreOS(512), diskSize: 1 << 30,
			err: "disk size 1 GiB is too small: the base alone needs 1.50 GiB"},
		{name: "disk smaller than base plus images", base: coreOS(512), fs: 100 * MiB, diskSize: 1600 * MiB,
			err: "so at least 1.60 GiB"},
		{name: "disk not whole sectors", base: coreOS(4096), fs: MiB, diskSize: 4<<30 + 512,
			err: "not a multiple of the 4096-byte sector size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := Geometry{DiskSize: tt.diskSize, PartitionSize: tt.partSize, Headroom: tt.headroom, Placement: tt.place}
			p, err := placeImagePartition(tt.base, "base.raw", o)
			var g geometry
			if err == nil {
				g, err = p.size(tt.fs, 0, o)
			}
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g.start != tt.start || g.partSize != tt.part || g.rootDst != tt.root || g.diskSize != tt.disk {
				t.Errorf("start %d MiB, partition %d MiB, root at %d MiB, disk %d MiB; want %d, %d, %d, %d",
					g.start/MiB, g.partSize/MiB, g.rootDst/MiB, g.diskSize/MiB, tt.start/MiB, tt.part/MiB, tt.root/MiB, tt.disk/MiB)
			}
			segs := g.segments()
			if tt.root != 0 && (len(segs) != 2 || segs[1].dst != tt.root || segs[1].src != tt.base.Partitions[2].Offset) {
				t.Errorf("segments %+v: root does not move to %d", segs, tt.root)
			}
		})
	}
}
