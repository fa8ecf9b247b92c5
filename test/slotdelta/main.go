// Command slotdelta measures what a slot delta costs: for two slot images
// (a release's OS partition and the next one's), the bytes a stick carries
// (the pack of chunks the old image lacks) and the index's size, for kiln's
// chunking and for the alternatives docs/BENCHMARKS.md compares.
//
//	go run ./test/slotdelta OLD.img NEW.img [CHANGED-BYTES]
//
// With CHANGED-BYTES (e.g. the installed size of the package that was added)
// it also prints the pack's size over it.
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/kiln-appliance/kiln/builder/slotcut"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: slotdelta OLD.img NEW.img [CHANGED-BYTES]")
		os.Exit(2)
	}
	var changed float64
	if len(os.Args) > 3 {
		changed, _ = strconv.ParseFloat(os.Args[3], 64)
	}
	for _, avg := range []uint8{14, 16, 18, 20} {
		p := slotcut.Default
		p.AverageBits = avg
		p.MinSize = uint32(max(slot.MinChunkSize, 1<<(avg-2)))
		p.MaxSize = 1 << (avg + 2)
		base, x := cut(os.Args[1], p), cut(os.Args[2], p)
		packed := slot.PackSize(slot.Lacking(x, base))
		line := fmt.Sprintf("average %4d KiB (min %d, max %d KiB): %d chunks, index %d KiB, pack %d bytes (%.1f%% of the image)",
			1<<(avg-10), p.MinSize>>10, p.MaxSize>>10, len(x.Chunks), (60+36*len(x.Chunks))>>10, packed, 100*float64(packed)/float64(x.Size))
		if changed > 0 {
			line += fmt.Sprintf(", pack / changed %.2f", float64(packed)/changed)
		}
		fmt.Println(line)
	}
}

func cut(name string, p slot.Params) *slot.Index {
	f, err := os.Open(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	x, err := slotcut.CutWith(f, p)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	return x
}
