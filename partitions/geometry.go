package partitions

import (
	"errors"
	"fmt"

	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/seal"
)

// Where everything goes on the disk, computed from the base's layout and the
// sizes alone: no I/O, so every rule is a row in a table test.

// placement is the first half of the plan, known before the image
// filesystem is written: where the image partition starts.
type placement struct {
	sector   int64
	root     *gpt.Partition // the base's root when it moves after the image partition, else nil
	keepEnd  int64          // base bytes [0, keepEnd) stay where they are
	start    int64          // the image partition's offset
	baseNeed int64          // bytes the base's partitions take on the disk
}

// geometry is the whole plan, once the image filesystem's size is known.
type geometry struct {
	placement
	partSize int64 // the image partition's size
	rootDst  int64 // root's new offset, when it moves
	diskSize int64
}

// placeImagePartition decides where the image partition goes (see
// Geometry.Placement) and refuses a fixed disk size that cannot even hold
// the base. baseName names the base in messages.
func placeImagePartition(base *gpt.Layout, baseName string, g Geometry) (placement, error) {
	p := placement{sector: int64(base.SectorSize)}
	var err error
	switch place := g.Placement; place {
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
	if g.DiskSize > 0 && g.DiskSize < p.baseNeed+MiB {
		return p, &SizeError{Field: DiskSizeField, Size: g.DiskSize, Base: p.baseNeed}
	}
	return p, nil
}

// The recipe fields a SizeError is about.
const (
	DiskSizeField      = "disk.size"
	PartitionSizeField = "imagePartition.size"
)

// SizeError is a fixed size (the recipe's disk.size or imagePartition.size)
// too small for what must fit in it, and how large it must be.
type SizeError struct {
	Field string // DiskSizeField or PartitionSizeField
	Size  int64  // as given
	Base  int64  // bytes the base's partitions take on the disk
	// Partition and Need: the image partition (its content) and the disk or
	// partition size that fits. 0: not known yet (the disk then needs Base
	// and an image partition).
	Partition, Need int64
	// Known, when set, says the content is not known yet and what Need
	// counts ("the node's kiln binary (11 MiB)"): Need is then the least
	// that could fit, not enough for sure.
	Known  string
	Sector int64 // set when Size is not whole sectors of this size
}

func (e *SizeError) Error() string {
	size, need := human(e.Size), human(alignUp(e.Need, MiB))
	switch {
	case e.Sector != 0:
		return fmt.Sprintf("disk size %d bytes is not a multiple of the %d-byte sector size; use a size in MiB or GiB", e.Size, e.Sector)
	case e.Field == PartitionSizeField && e.Known != "":
		return fmt.Sprintf("image partition size %s is too small: with kiln's seal it needs at least %s for %s alone; set %s to at least %s and more for the images (the exact size is said once they are fetched), or to auto",
			size, human(e.Need), e.Known, e.Field, need)
	case e.Field == PartitionSizeField:
		return fmt.Sprintf("image partition size %s is too small: the image filesystem (with its verity tree and kiln's seal) needs %s; set %s to at least %s, or to auto",
			size, human(e.Need), e.Field, need)
	case e.Need == 0:
		return fmt.Sprintf("disk size %s is too small: the base alone needs %s; set %s to at least %s plus the image partition (about the size of the images), or to fit",
			size, human(e.Base), e.Field, human(e.Base))
	case e.Known != "":
		return fmt.Sprintf("disk size %s is too small: the base needs %s, and the image partition at least %s for %s alone; set %s to at least %s and more for the images (the exact size is said once they are fetched), or to fit",
			size, human(e.Base), human(e.Partition), e.Known, e.Field, need)
	}
	return fmt.Sprintf("disk size %s is too small: the base needs %s, the image partition %s, so at least %s; set %s to at least %s, or to fit",
		size, human(e.Base), human(e.Partition), need, e.Field, need)
}

// size completes the plan for an image filesystem of fsSize bytes followed
// by extra bytes (its verity tree and kiln's seal): the partition is both
// plus o.Headroom percent of the filesystem (or o.PartitionSize when
// fixed), root follows it when it moves, and the disk fits it all plus the
// backup GPT (or is o.DiskSize when fixed).
func (p placement) size(fsSize, extra int64, o Geometry) (geometry, error) {
	partitionSize, diskSize := o.PartitionSize, o.DiskSize
	g := geometry{placement: p}
	g.partSize = alignUp(fsSize+extra+fsSize*int64(o.Headroom)/100, MiB)
	if partitionSize > 0 {
		if need := fsSize + extra; partitionSize < need {
			return g, &SizeError{Field: PartitionSizeField, Size: partitionSize, Need: need}
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
			return g, &SizeError{Field: DiskSizeField, Size: diskSize, Base: p.baseNeed, Partition: g.partSize, Need: need}
		}
		if diskSize%p.sector != 0 {
			return g, &SizeError{Field: DiskSizeField, Size: diskSize, Sector: p.sector}
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

// CheckSizes refuses, before any long work, a fixed g.DiskSize or
// g.PartitionSize that cannot hold the base at basePath and an image
// filesystem of least bytes: a lower bound of the content, which known says
// (the node's kiln binary, the largest served image).
func CheckSizes(basePath string, g Geometry, least int64, known string) error {
	if g.DiskSize == 0 && g.PartitionSize == 0 {
		return nil
	}
	l, _, err := base.ReadLayout(basePath)
	if err != nil {
		return err
	}
	place, err := placeImagePartition(l, basePath, g)
	if err != nil {
		return err
	}
	_, err = place.size(least, seal.Size, g)
	var se *SizeError
	if errors.As(err, &se) && se.Sector == 0 {
		se.Known = known
	}
	return err
}

// lastRoot finds the partition named root and checks it is physically last.
func lastRoot(l *gpt.Layout) (*gpt.Partition, error) {
	var root *gpt.Partition
	for i := range l.Partitions {
		if l.Partitions[i].Name == "root" {
			root = &l.Partitions[i]
		}
	}
	if root == nil {
		return nil, fmt.Errorf("no partition named \"root\" to move after the image partition (partitions: %s)", l.Names())
	}
	for _, p := range l.Partitions {
		if p.Offset > root.Offset {
			return nil, fmt.Errorf("partition %d %q lies after root; kiln moves root only when it is the last partition", p.Number, p.Name)
		}
	}
	return root, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// MiB is the alignment of partitions kiln adds.
const MiB = 1 << 20

// human prints a byte count the way sizes are written in recipes.
func human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= MiB && n%MiB == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= MiB:
		return fmt.Sprintf("%.2f MiB", float64(n)/MiB)
	}
	return fmt.Sprintf("%d bytes", n)
}
