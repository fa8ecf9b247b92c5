package partitions

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

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
}

// VerifyReport is what VerifyDisk checked and what it could not.
type VerifyReport struct {
	Seal      *Seal
	Checked   []string // parts checked, in order
	Unchecked []string // part: why not
}

// VerifyError names the part of the disk that failed.
type VerifyError struct {
	Part string // "GPT", "partition 3 (boot)", "image partition", "seal", …
	Err  error
}

func (e *VerifyError) Error() string { return e.Part + ": " + e.Err.Error() }
func (e *VerifyError) Unwrap() error { return e.Err }

// VerifyDisk checks the disk at path against the seal kiln wrote into it:
// both GPT copies with their CRCs, every partition's bytes, every byte
// outside them, and the image partition through its verity tree. It stops
// at the first damaged part and never panics, whatever the bytes.
func VerifyDisk(ctx context.Context, path string, o VerifyOptions) (rep *VerifyReport, err error) {
	defer func() {
		if r := recover(); r != nil { // a reader bug must not turn into exit 2
			rep, err = nil, &VerifyError{"disk", fmt.Errorf("unreadable (kiln's reader failed: %v): damaged or not a kiln disk", r)}
		}
	}()
	f, err := openDisk(path)
	if err != nil {
		return nil, fmt.Errorf("verify disk: %w", err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	rep = &VerifyReport{}
	sector, err := sectorSize(f)
	if err != nil {
		return nil, &VerifyError{"GPT", err}
	}
	sec := int64(sector)
	primary, err := readGPTCopy(f, 1, sec, size)
	if err != nil {
		return nil, &VerifyError{"primary GPT", fmt.Errorf("%w; a kiln disk must be exact: reflash it", err)}
	}
	l, _, err := readLayout(f, path)
	if err != nil {
		return nil, &VerifyError{"GPT", err}
	}
	l.Size = size
	name := o.PartitionName
	if name == "" {
		name = contract.PartitionName
	}
	if err := l.checkOne(name); err != nil {
		return nil, &VerifyError{"GPT", err}
	}
	img, ok := l.Find(name)
	if !ok {
		return nil, &VerifyError{"GPT", fmt.Errorf("no %s partition (partitions: %s): not a kiln disk", name, l.names())}
	}
	area := make([]byte, SealSize)
	if img.Size < SealSize {
		return nil, &VerifyError{"image partition", fmt.Errorf("%d bytes: too small to hold kiln's seal", img.Size)}
	}
	if _, err := f.ReadAt(area, img.Offset+img.Size-SealSize); err != nil {
		return nil, &VerifyError{"seal", fmt.Errorf("read: %w", err)}
	}
	if string(area[:len(sealMagic)]) != sealMagic {
		return nil, &VerifyError{"seal", fmt.Errorf("no kiln seal at the end of partition %d (%s): the disk was built by a kiln without seals (rebuild it to verify it exactly), or that area is damaged", img.Number, name)}
	}
	if got := SealGUID(area); got != l.GUID {
		return nil, &VerifyError{"seal", fmt.Errorf("kiln's record at the end of partition %d (%s) hashes to %s but the disk GUID is %s: the record or the GPT header is damaged, or the disk was not built by this kiln", img.Number, name, got, l.GUID)}
	}
	s, err := decodeSeal(area)
	if err != nil {
		return nil, &VerifyError{"seal", err}
	}
	rep.Seal = s
	rep.Checked = append(rep.Checked, "seal (matches the disk GUID)")

	// The GPT: both copies, CRCs, and what the seal says.
	if o.Booted {
		rep.Unchecked = append(rep.Unchecked, "GPT headers and backup GPT: the node moves the backup to the end of its disk and grows root")
	} else {
		if size < s.DiskSize {
			return nil, &VerifyError{"disk", truncated(size, s.DiskSize)}
		}
		// A device is as large as it is; a file that is longer than the
		// disk was made so after the build (a copy of a whole stick?).
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && size > s.DiskSize {
			rep.Unchecked = append(rep.Unchecked, fmt.Sprintf("bytes %d-%d of the file, after the end of the disk the build wrote (%d bytes)", s.DiskSize, size-1, s.DiskSize))
		}
		if primary.alternate != (s.DiskSize/sec)-1 {
			return nil, &VerifyError{"primary GPT", fmt.Errorf("says its backup is at LBA %d, the build put it at LBA %d", primary.alternate, s.DiskSize/sec-1)}
		}
		backup, err := readGPTCopy(f, primary.alternate, sec, size)
		if err != nil {
			return nil, &VerifyError{"backup GPT", fmt.Errorf("%w (sgdisk -v shows details)", err)}
		}
		if backup.alternate != 1 || string(backup.entries) != string(primary.entries) {
			return nil, &VerifyError{"backup GPT", errors.New("differs from the primary (sgdisk -v shows details)")}
		}
		if d, err := headerDigest(s.SchemaVersion, f, sec); err != nil || d != s.GPTHeaders {
			return nil, &VerifyError{"GPT headers", fmt.Errorf("differ from the build's (%v)", err)}
		}
		if s.SchemaVersion < fullHeaderSectors {
			rep.Unchecked = append(rep.Unchecked, fmt.Sprintf("bytes 92-%d of the GPT header sectors (LBA 1 and LBA %d): "+
				"this disk's seal (version %d) does not record them; a disk built by this kiln has every byte checked", sec-1, primary.alternate, s.SchemaVersion))
		}
		if d, err := outsideDigest(ctx, s.SchemaVersion, io.NewSectionReader(f, 0, s.DiskSize), s.DiskSize, sec, l.Partitions, 1, primary.alternate); err != nil {
			return nil, &VerifyError{"disk", err}
		} else if d != s.Outside {
			return nil, &VerifyError{"protective MBR, GPT entries or the gaps between partitions", errors.New("differ from what the build wrote")}
		}
		rep.Checked = append(rep.Checked, "GPT (both copies, CRCs, headers, entries)", "protective MBR and the gaps between partitions")
	}

	// Every partition's GPT entry as built. Then the image partition (small
	// and most likely damaged in transit), then the others' bytes.
	if len(s.Partitions) != len(l.Partitions) {
		return nil, &VerifyError{"GPT", fmt.Errorf("%d partitions, the build wrote %d", len(l.Partitions), len(s.Partitions))}
	}
	for i, sp := range s.Partitions {
		p := l.Partitions[i]
		part := fmt.Sprintf("partition %d (%s)", sp.Number, sp.Name)
		grows := o.Booted && sp.Name == "root"
		if p.Number != sp.Number || p.Name != sp.Name || p.Type != sp.Type || p.GUID != sp.GUID || p.Attributes != sp.Attributes ||
			p.FirstLBA != sp.FirstLBA || (p.LastLBA != sp.LastLBA && !(grows && p.LastLBA > sp.LastLBA)) {
			return nil, &VerifyError{part, fmt.Errorf("its GPT entry differs from the build's (number %d, name %q, GUID %s, LBA %d-%d; built: GUID %s, LBA %d-%d)",
				p.Number, p.Name, p.GUID, p.FirstLBA, p.LastLBA, sp.GUID, sp.FirstLBA, sp.LastLBA)}
		}
	}

	// The image partition: verity, then the bytes verity does not cover.
	ip := fmt.Sprintf("image partition %d (%s)", img.Number, name)
	part := io.NewSectionReader(f, img.Offset, img.Size)
	if v := s.Image.Verity; v != nil {
		g, err := RootHashGUID(v.RootHash)
		if err != nil {
			return nil, &VerifyError{"seal", err}
		}
		if g != img.GUID {
			return nil, &VerifyError{ip, fmt.Errorf("its GUID %s is not derived from the verity root hash %s", img.GUID, v.RootHash)}
		}
		if v.HashOffset != s.Image.FSSize || s.Image.DigestFrom != v.HashOffset+v.HashSize {
			return nil, &VerifyError{"seal", errors.New("its verity layout is not one kiln writes")}
		}
		if err := checkVerity(ctx, part, *v); err != nil {
			return nil, &VerifyError{ip, err}
		}
		rep.Checked = append(rep.Checked, ip+": every block through dm-verity (root hash "+v.RootHash+")")
	} else {
		rep.Checked = append(rep.Checked, ip+": every byte by sha256 (built without dm-verity)")
	}
	from := s.Image.DigestFrom
	if from < 0 || from > img.Size-SealSize {
		return nil, &VerifyError{"seal", fmt.Errorf("image digest starts at byte %d, outside the partition", from)}
	}
	if d, err := digestRange(ctx, s.SchemaVersion, part, from, img.Size-SealSize-from); err != nil {
		return nil, &VerifyError{ip, err}
	} else if d != s.Image.Digest {
		return nil, &VerifyError{ip, fmt.Errorf("bytes %d-%d differ from what the build wrote", from, img.Size-SealSize-1)}
	}

	// Every other partition's bytes.
	for i, sp := range s.Partitions {
		p := l.Partitions[i]
		part := fmt.Sprintf("partition %d (%s)", sp.Number, sp.Name)
		if p.Number == img.Number {
			continue
		}
		if o.Booted && (sp.Name == "root" || sp.Name == BootPartition) {
			rep.Unchecked = append(rep.Unchecked, part+": the node writes it from first boot on")
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := digestRange(ctx, s.SchemaVersion, f, p.Offset, int64(sp.LastLBA-sp.FirstLBA+1)*sec)
		if err != nil {
			return nil, &VerifyError{part, err}
		}
		if d != sp.Digest {
			hint := ""
			if sp.Name == BootPartition || sp.Name == "root" {
				hint = " (if this disk has booted, run kiln verify --booted)"
			}
			return nil, &VerifyError{part, fmt.Errorf("differs from what the build wrote: sha256 %s, built %s%s", d, sp.Digest, hint)}
		}
		rep.Checked = append(rep.Checked, part)
	}

	return rep, nil
}

// gptCopy is one GPT header and its entry array, CRCs checked.
type gptCopy struct {
	alternate int64
	entries   []byte
}

// readGPTCopy reads the GPT header at lba and its entries, checking both
// CRCs and that the header says it is at lba.
func readGPTCopy(r io.ReaderAt, lba, sector, size int64) (*gptCopy, error) {
	if lba <= 0 || (lba+1)*sector > size {
		return nil, fmt.Errorf("header at LBA %d lies outside the disk (%d sectors): the disk is truncated or the primary header is damaged", lba, size/sector)
	}
	h := make([]byte, sector)
	if _, err := r.ReadAt(h, lba*sector); err != nil {
		return nil, fmt.Errorf("read header at LBA %d: %w", lba, err)
	}
	if string(h[:8]) != "EFI PART" {
		return nil, fmt.Errorf("no GPT header at LBA %d", lba)
	}
	hsize := binary.LittleEndian.Uint32(h[12:16])
	if hsize < 92 || int64(hsize) > sector {
		return nil, fmt.Errorf("header at LBA %d: size %d is invalid", lba, hsize)
	}
	hdr := append([]byte(nil), h[:hsize]...)
	want := binary.LittleEndian.Uint32(hdr[16:20])
	clear(hdr[16:20])
	if got := crc32.ChecksumIEEE(hdr); got != want {
		return nil, fmt.Errorf("header at LBA %d is damaged: CRC %08x, it says %08x", lba, got, want)
	}
	if my := int64(binary.LittleEndian.Uint64(h[24:32])); my != lba {
		return nil, fmt.Errorf("header at LBA %d says it is at LBA %d", lba, my)
	}
	entLBA := int64(binary.LittleEndian.Uint64(h[72:80]))
	n, esize := int64(binary.LittleEndian.Uint32(h[80:84])), int64(binary.LittleEndian.Uint32(h[84:88]))
	if esize < 128 || esize > 4096 || n > 4096 || entLBA <= 0 || entLBA*sector+n*esize > size {
		return nil, fmt.Errorf("header at LBA %d describes an impossible entry array (%d entries of %d bytes at LBA %d)", lba, n, esize, entLBA)
	}
	ents := make([]byte, n*esize)
	if _, err := r.ReadAt(ents, entLBA*sector); err != nil {
		return nil, fmt.Errorf("read entries at LBA %d: %w", entLBA, err)
	}
	if got, want := crc32.ChecksumIEEE(ents), binary.LittleEndian.Uint32(h[88:92]); got != want {
		return nil, fmt.Errorf("partition entries at LBA %d are damaged: CRC %08x, the header says %08x", entLBA, got, want)
	}
	return &gptCopy{alternate: int64(binary.LittleEndian.Uint64(h[32:40])), entries: ents}, nil
}
