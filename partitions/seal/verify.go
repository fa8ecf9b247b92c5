package seal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// VerifyOptions say what `kiln verify` may expect of the disk.
type VerifyOptions struct {
	// Booted: the disk has run on a node, which writes boot (Ignition,
	// mount counts) and root, grows root and moves the backup GPT to the
	// end of the device; those parts are then reported as not checked.
	Booted bool
	// PartitionName is the partition kiln added, whose end holds the seal
	// (default contract.PartitionName; a reflash stick's is its payload).
	PartitionName string
	// Upgradable says which partitions a node's upgrades rewrite (an A/B
	// disk's ESP and OS slots). On a booted disk, one whose bytes differ
	// from the build's goes to Report.Rewritten, for the caller to check
	// by what the node wrote, instead of failing.
	Upgradable func(gpt.Partition) bool
	// Progress, when set, shows the bytes read, of the disk's size, as a
	// task named for the disk (reading a large disk takes minutes).
	Progress progress.Reporter
}

// Report is what Verify checked and what it could not.
type Report struct {
	Seal      *Seal
	Checked   []string // parts checked, in order
	Unchecked []string // part: why not
	// Rewritten are the upgradable partitions (VerifyOptions.Upgradable)
	// of a booted disk that differ from the build's: not checked here.
	Rewritten []gpt.Partition
}

// VerifyError names the part of the disk that failed.
type VerifyError struct {
	Part string // "GPT", "partition 3 (boot)", "image partition", "seal", …
	Err  error
}

func (e *VerifyError) Error() string { return e.Part + ": " + e.Err.Error() }
func (e *VerifyError) Unwrap() error { return e.Err }

// Verify checks the disk at path against the seal kiln wrote into it:
// both GPT copies with their CRCs, every partition's bytes, every byte
// outside them, and the image partition through its verity tree. It stops
// at the first damaged part and never panics, whatever the bytes.
func Verify(ctx context.Context, path string, o VerifyOptions) (rep *Report, err error) {
	var v *verification
	defer func() { // last: err is final, a recovered panic's too
		if v != nil && v.task != nil {
			v.task.Done(err)
		}
	}()
	defer func() {
		if r := recover(); r != nil { // a reader bug must not turn into exit 2
			rep, err = nil, &VerifyError{"disk", fmt.Errorf("unreadable (kiln's reader failed: %v): damaged or not a kiln disk", r)}
		}
	}()
	f, err := gpt.OpenDisk(path)
	if err != nil {
		return nil, fmt.Errorf("verify disk: %w", err)
	}
	defer f.Close()
	v = &verification{f: f, r: f, path: path, o: o, rep: &Report{}}
	if v.o.PartitionName == "" {
		v.o.PartitionName = contract.PartitionName
	}
	// The image partition (small and most likely damaged in transit) before
	// the others' bytes.
	for _, step := range []func(context.Context) error{
		v.readTable,
		v.readSeal,
		v.checkGPT,
		v.checkEntries,
		v.checkImage,
		v.checkPartitions,
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return v.rep, nil
}

// verification is one run of Verify: each step reads what the steps before
// it left here.
type verification struct {
	f    *os.File
	r    io.ReaderAt   // f, counting on task once the seal says the disk's size
	path string        // as given, to name the task
	task progress.Task // nil without o.Progress
	o    VerifyOptions
	rep  *Report

	size    int64       // bytes of the file or device
	sector  int64       // bytes
	primary *gpt.Copy   // the primary GPT, CRCs checked
	layout  *gpt.Layout // as the primary GPT says
	img     *gpt.Partition
	seal    *Seal
}

// digests are the disk's digests as its seal computes them.
func (v *verification) digests(r io.ReaderAt) digests {
	return digests{version: v.seal.SchemaVersion, r: r, sector: v.sector}
}

// readTable reads the primary GPT and finds the partition that holds the
// seal.
func (v *verification) readTable(context.Context) error {
	var err error
	if v.size, err = v.f.Seek(0, io.SeekEnd); err != nil {
		return err
	}
	sector, err := gpt.SectorSize(v.f)
	if err != nil {
		return &VerifyError{"GPT", err}
	}
	v.sector = int64(sector)
	if v.primary, err = gpt.ReadCopy(v.f, 1, v.sector, v.size); err != nil {
		return &VerifyError{"primary GPT", fmt.Errorf("%w; a kiln disk must be exact: reflash it", err)}
	}
	if v.layout, err = gpt.Read(v.f, v.f.Name()); err != nil {
		return &VerifyError{"GPT", err}
	}
	v.layout.Size = v.size
	name := v.o.PartitionName
	if err := v.layout.CheckOne(name); err != nil {
		return &VerifyError{"GPT", err}
	}
	img, ok := v.layout.Find(name)
	if !ok {
		return &VerifyError{"GPT", fmt.Errorf("no %s partition (partitions: %s): not a kiln disk", name, v.layout.Names())}
	}
	v.img = img
	return nil
}

// readSeal reads the seal at the end of the image partition and checks it
// against the disk GUID.
func (v *verification) readSeal(context.Context) error {
	img, name := v.img, v.o.PartitionName
	area := make([]byte, Size)
	if img.Size < Size {
		return &VerifyError{"image partition", fmt.Errorf("%d bytes: too small to hold kiln's seal", img.Size)}
	}
	if _, err := v.f.ReadAt(area, img.Offset+img.Size-Size); err != nil {
		return &VerifyError{"seal", fmt.Errorf("read: %w", err)}
	}
	if string(area[:len(magic)]) != magic {
		return &VerifyError{"seal", fmt.Errorf("no kiln seal at the end of partition %d (%s): the disk was built by a kiln without seals (rebuild it to verify it exactly), or that area is damaged", img.Number, name)}
	}
	if got := GUID(area); got != v.layout.GUID {
		return &VerifyError{"seal", fmt.Errorf("kiln's record at the end of partition %d (%s) hashes to %s but the disk GUID is %s: the record or the GPT header is damaged, or the disk was not built by this kiln", img.Number, name, got, v.layout.GUID)}
	}
	s, err := decode(area)
	if err != nil {
		return &VerifyError{"seal", err}
	}
	v.seal, v.rep.Seal = s, s
	if v.o.Progress != nil {
		v.task = v.o.Progress.Task("verify "+v.path+" against its seal", s.DiskSize)
		v.r = countingReader{v.f, v.task}
	}
	v.rep.Checked = append(v.rep.Checked, "seal (matches the disk GUID)")
	return nil
}

// checkGPT checks both GPT copies, their CRCs, and what the seal says of
// them and of every byte outside the partitions. A booted disk's are
// reported as not checked.
func (v *verification) checkGPT(ctx context.Context) error {
	s, sec, rep := v.seal, v.sector, v.rep
	if v.o.Booted {
		rep.Unchecked = append(rep.Unchecked, "GPT headers and backup GPT: the node moves the backup to the end of its disk and grows root")
		return nil
	}
	if v.size < s.DiskSize {
		return &VerifyError{"disk", gpt.Truncated(v.size, s.DiskSize)}
	}
	// A device is as large as it is; a file that is longer than the
	// disk was made so after the build (a copy of a whole stick?).
	if fi, err := v.f.Stat(); err == nil && fi.Mode().IsRegular() && v.size > s.DiskSize {
		rep.Unchecked = append(rep.Unchecked, fmt.Sprintf("bytes %d-%d of the file, after the end of the disk the build wrote (%d bytes)", s.DiskSize, v.size-1, s.DiskSize))
	}
	alt := v.primary.Alternate
	if alt != (s.DiskSize/sec)-1 {
		return &VerifyError{"primary GPT", fmt.Errorf("says its backup is at LBA %d, the build put it at LBA %d", alt, s.DiskSize/sec-1)}
	}
	backup, err := gpt.ReadCopy(v.f, alt, sec, v.size)
	if err != nil {
		return &VerifyError{"backup GPT", fmt.Errorf("%w (sgdisk -v shows details)", err)}
	}
	if backup.Alternate != 1 || string(backup.Entries) != string(v.primary.Entries) {
		return &VerifyError{"backup GPT", errors.New("differs from the primary (sgdisk -v shows details)")}
	}
	if d, err := v.digests(v.f).headers(); err != nil || d != s.GPTHeaders {
		return &VerifyError{"GPT headers", fmt.Errorf("differ from the build's (%v)", err)}
	}
	if s.SchemaVersion < fullHeaderSectors {
		rep.Unchecked = append(rep.Unchecked, fmt.Sprintf("bytes 92-%d of the GPT header sectors (LBA 1 and LBA %d): "+
			"this disk's seal (version %d) does not record them; a disk built by this kiln has every byte checked", sec-1, alt, s.SchemaVersion))
	}
	if d, err := v.digests(io.NewSectionReader(v.r, 0, s.DiskSize)).outside(ctx, s.DiskSize, v.layout.Partitions, 1, alt); err != nil {
		return &VerifyError{"disk", err}
	} else if d != s.Outside {
		return &VerifyError{"protective MBR, GPT entries or the gaps between partitions", errors.New("differ from what the build wrote")}
	}
	rep.Checked = append(rep.Checked, "GPT (both copies, CRCs, headers, entries)", "protective MBR and the gaps between partitions")
	return nil
}

// checkEntries checks every partition's GPT entry against the build's (a
// booted disk's root may have grown).
func (v *verification) checkEntries(context.Context) error {
	s, l := v.seal, v.layout
	if len(s.Partitions) != len(l.Partitions) {
		return &VerifyError{"GPT", fmt.Errorf("%d partitions, the build wrote %d", len(l.Partitions), len(s.Partitions))}
	}
	for i, sp := range s.Partitions {
		p := l.Partitions[i]
		part := fmt.Sprintf("partition %d (%s)", sp.Number, sp.Name)
		grows := v.o.Booted && sp.Name == "root"
		if p.Number != sp.Number || p.Name != sp.Name || p.Type != sp.Type || p.GUID != sp.GUID || p.Attributes != sp.Attributes ||
			p.FirstLBA != sp.FirstLBA || (p.LastLBA != sp.LastLBA && !(grows && p.LastLBA > sp.LastLBA)) {
			return &VerifyError{part, fmt.Errorf("its GPT entry differs from the build's (number %d, name %q, GUID %s, LBA %d-%d; built: GUID %s, LBA %d-%d)",
				p.Number, p.Name, p.GUID, p.FirstLBA, p.LastLBA, sp.GUID, sp.FirstLBA, sp.LastLBA)}
		}
	}
	return nil
}

// checkImage checks the image partition: through its verity tree, then the
// bytes verity does not cover.
func (v *verification) checkImage(ctx context.Context) error {
	s, img := v.seal, v.img
	ip := fmt.Sprintf("image partition %d (%s)", img.Number, v.o.PartitionName)
	part := io.NewSectionReader(v.r, img.Offset, img.Size)
	if vt := s.Image.Verity; vt != nil {
		g, err := vt.PartitionGUID()
		if err != nil {
			return &VerifyError{"seal", err}
		}
		if g != img.GUID {
			return &VerifyError{ip, fmt.Errorf("its GUID %s is not derived from the verity root hash %s", img.GUID, vt.RootHash)}
		}
		if vt.HashOffset != s.Image.FSSize || s.Image.DigestFrom != vt.HashOffset+vt.HashSize {
			return &VerifyError{"seal", errors.New("its verity layout is not one kiln writes")}
		}
		if err := verity.Check(ctx, part, *vt); err != nil {
			return &VerifyError{ip, err}
		}
		v.rep.Checked = append(v.rep.Checked, ip+": every block through dm-verity (root hash "+vt.RootHash+")")
	} else {
		v.rep.Checked = append(v.rep.Checked, ip+": every byte by sha256 (built without dm-verity)")
	}
	from := s.Image.DigestFrom
	if from < 0 || from > img.Size-Size {
		return &VerifyError{"seal", fmt.Errorf("image digest starts at byte %d, outside the partition", from)}
	}
	if d, err := v.digests(part).span(ctx, from, img.Size-Size-from); err != nil {
		return &VerifyError{ip, err}
	} else if d != s.Image.Digest {
		return &VerifyError{ip, fmt.Errorf("bytes %d-%d differ from what the build wrote", from, img.Size-Size-1)}
	}
	return nil
}

// checkPartitions checks every other partition's bytes (a booted disk's
// boot and root are reported as not checked).
func (v *verification) checkPartitions(ctx context.Context) error {
	for i, sp := range v.seal.Partitions {
		p := v.layout.Partitions[i]
		part := fmt.Sprintf("partition %d (%s)", sp.Number, sp.Name)
		if p.Number == v.img.Number {
			continue
		}
		if v.o.Booted && (sp.Name == "root" || sp.Name == bootconfig.Partition) {
			v.rep.Unchecked = append(v.rep.Unchecked, part+": the node writes it from first boot on")
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := v.digests(v.r).span(ctx, p.Offset, int64(sp.LastLBA-sp.FirstLBA+1)*v.sector)
		if err != nil {
			return &VerifyError{part, err}
		}
		if d != sp.Digest && v.o.Booted && v.o.Upgradable != nil && v.o.Upgradable(p) {
			v.rep.Rewritten = append(v.rep.Rewritten, p)
			continue
		}
		if d != sp.Digest {
			hint := ""
			if sp.Name == bootconfig.Partition || sp.Name == "root" || (v.o.Upgradable != nil && v.o.Upgradable(p)) {
				hint = " (if this disk has booted, run kiln verify --booted)"
			}
			return &VerifyError{part, fmt.Errorf("differs from what the build wrote: %s, built %s%s", d, sp.Digest, hint)}
		}
		v.rep.Checked = append(v.rep.Checked, part)
	}
	return nil
}

// countingReader counts the bytes read from r on w (a progress task).
type countingReader struct {
	r io.ReaderAt
	w io.Writer
}

func (c countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	progress.Count(c.w, int64(n))
	return n, err
}
