package partitions

import "fmt"

// Where everything goes on the disk, computed from the base's layout and the
// sizes alone: no I/O, so every rule is a row in a table test.

// placement is the first half of the plan, known before the image
// filesystem is written: where the image partition starts.
type placement struct {
	sector   int64
	root     *Partition // the base's root when it moves after the image partition, else nil
	keepEnd  int64      // base bytes [0, keepEnd) stay where they are
	start    int64      // the image partition's offset
	baseNeed int64      // bytes the base's partitions take on the disk
}

// geometry is the whole plan, once the image filesystem's size is known.
type geometry struct {
	placement
	partSize int64 // the image partition's size
	rootDst  int64 // root's new offset, when it moves
	diskSize int64
}

// placeImagePartition decides where the image partition goes (see
// AssembleOptions.Placement) and refuses a fixed disk size that cannot even
// hold the base. baseName names the base in messages.
func placeImagePartition(base *Layout, baseName, place string, diskSize int64) (placement, error) {
	p := placement{sector: int64(base.SectorSize)}
	var err error
	switch place {
	case PlaceBeforeRoot:
		if p.root, err = lastRoot(base); err != nil {
			return p, fmt.Errorf("base image %s: %w (set imagePartition.placement: end)", baseName, err)
		}
	case PlaceAuto, "":
		p.root, _ = lastRoot(base)
	case PlaceEnd:
	default:
		return p, fmt.Errorf("image partition placement %q: want %s, %s or %s", place, PlaceAuto, PlaceBeforeRoot, PlaceEnd)
	}
	for _, bp := range base.Partitions {
		if p.root == nil || bp.Number != p.root.Number {
			p.keepEnd = max(p.keepEnd, bp.Offset+bp.Size)
		}
	}
	p.start = alignUp(p.keepEnd, MiB)
	p.baseNeed = p.start
	if p.root != nil {
		p.baseNeed += alignUp(p.root.Size, MiB)
	}
	if diskSize > 0 && diskSize < p.baseNeed+MiB {
		return p, fmt.Errorf("disk size %s is too small: the base alone needs %s; set disk.size to at least %s plus the image partition (about the size of the images), or to fit",
			human(diskSize), human(p.baseNeed), human(p.baseNeed))
	}
	return p, nil
}

// size completes the plan for an image filesystem of fsSize bytes: the
// partition is fsSize plus headroom percent (or partitionSize when fixed),
// root follows it when it moves, and the disk fits it all plus the backup
// GPT (or is diskSize when fixed).
func (p placement) size(fsSize int64, headroom int, partitionSize, diskSize int64) (geometry, error) {
	g := geometry{placement: p}
	g.partSize = alignUp(fsSize+fsSize*int64(headroom)/100, MiB)
	if partitionSize > 0 {
		if partitionSize < fsSize {
			return g, fmt.Errorf("image partition size %s is too small: the image filesystem needs %s; set imagePartition.size to at least %s or to auto",
				human(partitionSize), human(fsSize), human(alignUp(fsSize, MiB)))
		}
		g.partSize = alignUp(partitionSize, MiB)
	}
	gptBackup := 33 * p.sector // backup partition array + header
	if p.sector == 4096 {
		gptBackup = 5 * p.sector
	}
	end := p.start + g.partSize
	if p.root != nil {
		g.rootDst = alignUp(end, MiB)
		end = g.rootDst + p.root.Size
	}
	need := alignUp(end+gptBackup, MiB)
	g.diskSize = need
	if diskSize > 0 {
		if diskSize < need {
			return g, fmt.Errorf("disk size %s is too small: the base needs %s, the image partition %s, so at least %s; set disk.size to at least %s or to fit",
				human(diskSize), human(p.baseNeed), human(g.partSize), human(need), human(need))
		}
		if diskSize%p.sector != 0 {
			return g, fmt.Errorf("disk size %d bytes is not a multiple of the %d-byte sector size; use a size in MiB or GiB", diskSize, p.sector)
		}
		g.diskSize = diskSize
	}
	return g, nil
}

// segments are the base's byte ranges and where they go on the disk.
func (g geometry) segments() []segment {
	segs := []segment{{src: 0, size: g.keepEnd, dst: 0}}
	if g.root != nil {
		segs = append(segs, segment{src: g.root.Offset, size: g.root.Size, dst: g.rootDst})
	}
	return segs
}
