// Package seal writes and checks kiln's seal: its record of every byte it
// wrote to a disk, the last Size bytes of the image partition. The seal
// travels with the disk (flashing copies it) and cannot be edited along
// with what it describes without showing: its sha256 is the disk GUID in
// both GPT headers, and what it describes includes the GPT entries, every
// partition (boot with the Ignition config that carries the verity root
// hash) and the image partition's verity tree, whose root hash is also that
// partition's GUID. `kiln verify` checks a disk against it (Verify). See
// docs/decisions.md.
package seal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/opencontainers/go-digest"
)

const (
	Size      = 64 << 10 // the seal's area at the end of the image partition
	magic     = "KILNSEAL"
	Version   = 3              // what this kiln writes; it reads 1 to Version
	headerLen = len(magic) + 4 // magic, uint32 length of the JSON
)

// writeVersion is the version Write seals as: Version, but in the tests
// that build the disks older kilns wrote (export_test.go).
var writeVersion = Version

// Seal is the record.
type Seal struct {
	SchemaVersion int   `json:"schemaVersion"`
	DiskSize      int64 `json:"diskSize"` // the image file's size, bytes
	SectorSize    int   `json:"sectorSize"`
	// GPTHeaders is the sha256 of the primary and backup GPT header
	// sectors with their CRC and disk GUID fields zeroed (the GUID is this
	// seal's digest). Before version 3 it covered only the headers' 92
	// bytes, not the reserved rest of their sectors (fullHeaderSectors).
	GPTHeaders string `json:"gptHeaders"`
	// Outside is the sha256 of every byte of the disk outside the partitions
	// and the two GPT header sectors: protective MBR, both entry arrays, gaps.
	Outside    string      `json:"outside"`
	Partitions []Partition `json:"partitions"` // by number, the image partition included
	Image      Image       `json:"image"`
}

// Partition is one GPT entry as built, and the sha256 of its bytes
// ("" for the image partition, which Image describes).
type Partition struct {
	Number     int    `json:"number"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	GUID       string `json:"guid"`
	FirstLBA   uint64 `json:"firstLBA"`
	LastLBA    uint64 `json:"lastLBA"`
	Attributes uint64 `json:"attributes,omitempty"`
	Digest     string `json:"digest,omitempty"`
}

// Image describes the image partition: its squashfs, its verity tree
// (nil when the recipe turns verity off), and the sha256 of the bytes
// from DigestFrom to the seal (everything verity does not cover).
type Image struct {
	FSSize     int64          `json:"fsSize"` // squashfs bytes, 4 KiB aligned
	Verity     *verity.Verity `json:"verity,omitempty"`
	DigestFrom int64          `json:"digestFrom"`
	Digest     string         `json:"digest"`
}

// encode lays s out in its Size area.
func encode(s *Seal) ([]byte, error) {
	js, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if headerLen+len(js) > Size {
		return nil, fmt.Errorf("seal record is %d bytes, more than the %d kiln reserves", len(js), Size-headerLen)
	}
	b := make([]byte, Size)
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[len(magic):], uint32(len(js)))
	copy(b[headerLen:], js)
	return b, nil
}

// decode parses a Size area; any damage is an error, never a panic.
func decode(b []byte) (*Seal, error) {
	if len(b) != Size || string(b[:len(magic)]) != magic {
		return nil, errors.New("no kiln seal record (magic KILNSEAL) at the end of the image partition")
	}
	n := int(binary.LittleEndian.Uint32(b[len(magic):]))
	if n > Size-headerLen {
		return nil, fmt.Errorf("seal record length %d is larger than its area", n)
	}
	var s Seal
	dec := json.NewDecoder(bytes.NewReader(b[headerLen : headerLen+n]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("seal record: %w", err)
	}
	if s.SchemaVersion < 1 || s.SchemaVersion > Version {
		return nil, fmt.Errorf("seal record version %d, this kiln reads 1 to %d", s.SchemaVersion, Version)
	}
	return &s, nil
}

// GUID is the disk GUID for a seal area: the first 128 bits of its
// sha256, upper case as gpt.Layout shows GUIDs.
func GUID(area []byte) string {
	sum := sha256.Sum256(area)
	return gpt.GUIDOf(sum[:16])
}

// Digest is the digest a seal written now records for size bytes of r at
// off (a partition, the image partition's bytes past its verity tree).
func Digest(ctx context.Context, r io.ReaderAt, off, size int64) (string, error) {
	return digests{version: writeVersion, r: r}.span(ctx, off, size)
}

// Write writes the seal of the disk f, laid out as l, at the end of its
// image partition img, with image the image partition's record, and
// returns the seal's area (whose GUID is to be the disk GUID: only the GPT
// headers change after it).
func Write(ctx context.Context, f *os.File, l *gpt.Layout, img *gpt.Partition, image Image) ([]byte, error) {
	d := digests{version: writeVersion, r: f, sector: int64(l.SectorSize)}
	s := &Seal{SchemaVersion: d.version, DiskSize: l.Size, SectorSize: l.SectorSize, Image: image}
	var err error
	if s.GPTHeaders, err = d.headers(); err != nil {
		return nil, err
	}
	_, backup, err := gpt.HeaderLBAs(f, d.sector)
	if err != nil {
		return nil, err
	}
	// The digests are independent: hash them on every CPU (mostly holes,
	// hashed from memory: hashSpan).
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	g.Go(func() (err error) {
		s.Outside, err = d.outside(ctx, l.Size, l.Partitions, 1, backup)
		return err
	})
	s.Partitions = make([]Partition, len(l.Partitions))
	for i, p := range l.Partitions {
		sp := &s.Partitions[i]
		*sp = Partition{Number: p.Number, Name: p.Name, Type: p.Type, GUID: p.GUID, FirstLBA: p.FirstLBA, LastLBA: p.LastLBA, Attributes: p.Attributes}
		if p.Number != img.Number {
			g.Go(func() (err error) {
				sp.Digest, err = d.span(ctx, p.Offset, p.Size)
				return err
			})
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	area, err := encode(s)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteAt(area, img.Offset+img.Size-Size); err != nil {
		return nil, fmt.Errorf("write seal: %w", err)
	}
	return area, nil
}

// digests are a disk's seal digests, as a seal of version computes them.
type digests struct {
	version int
	r       io.ReaderAt
	sector  int64
}

// fullHeaderSectors is the first seal version whose GPTHeaders covers the
// header sectors whole: a bit flipped in the reserved rest of either sector
// (bytes 92 to the sector's end) verified as OK before.
const fullHeaderSectors = 3

// headers hashes both GPT header sectors (only their first 92 bytes
// before fullHeaderSectors) without their CRC and disk GUID.
func (d digests) headers() (string, error) {
	p, b, err := gpt.HeaderLBAs(d.r, d.sector)
	if err != nil {
		return "", err
	}
	n := d.sector
	if d.version < fullHeaderSectors {
		n = 92
	}
	h := sha256.New()
	for _, lba := range []int64{p, b} {
		hdr := make([]byte, n)
		if _, err := d.r.ReadAt(hdr, lba*d.sector); err != nil {
			return "", fmt.Errorf("read GPT header at LBA %d: %w", lba, err)
		}
		clear(hdr[16:20]) // header CRC
		clear(hdr[56:72]) // disk GUID
		h.Write(hdr)
	}
	return digest.NewDigest(digest.SHA256, h).String(), nil
}

// span is a byte range of the disk.
type span struct{ off, size int64 }

// outside hashes every byte of the first size bytes of the disk that lies
// in none of parts and in none of the sectors skip.
func (d digests) outside(ctx context.Context, size int64, parts []gpt.Partition, skip ...int64) (string, error) {
	var inside []span
	for _, p := range parts {
		inside = append(inside, span{p.Offset, p.Size})
	}
	for _, lba := range skip {
		inside = append(inside, span{lba * d.sector, d.sector})
	}
	h := newSealHash(d.version)
	buf := make([]byte, mib)
	for off := int64(0); off < size; {
		next := size
		skipTo := int64(-1)
		for _, s := range inside {
			if s.off <= off && off < s.off+s.size {
				skipTo = max(skipTo, s.off+s.size)
			} else if s.off > off {
				next = min(next, s.off)
			}
		}
		if skipTo >= 0 {
			off = skipTo
			continue
		}
		if err := hashSpan(ctx, h, d.r, span{off, next - off}, buf); err != nil {
			return "", err
		}
		off = next
	}
	return h.digest(), nil
}

// hashSpan feeds h the bytes of r in s. A file's holes (the disk file
// kiln writes is sparse: the base's zero runs, the headroom) are hashed
// from zeros in memory rather than read (hashHoles).
func hashSpan(ctx context.Context, h io.Writer, r io.ReaderAt, s span, buf []byte) error {
	off, size := s.off, s.size
	// A section past the end of r would read short without an error.
	if end, err := sizeOf(r); err == nil && off+size > end {
		return fmt.Errorf("bytes %d-%d lie past the end of the disk (%d bytes): it is truncated", off, off+size-1, end)
	}
	if f, base, ok := fileOf(r); ok {
		return hashHoles(ctx, h, f, span{base + off, size}, buf)
	}
	return hashRead(ctx, h, r, s, buf)
}

// fileOf finds the file under r (a partition's section of the disk file)
// and r's offset in it.
func fileOf(r io.ReaderAt) (*os.File, int64, bool) {
	switch r := r.(type) {
	case *os.File:
		return r, 0, true
	case *io.SectionReader:
		outer, off, _ := r.Outer()
		f, base, ok := fileOf(outer)
		return f, base + off, ok
	}
	return nil, 0, false
}

func sizeOf(r io.ReaderAt) (int64, error) {
	if f, ok := r.(*os.File); ok {
		return f.Seek(0, io.SeekEnd)
	}
	if s, ok := r.(interface{ Size() int64 }); ok {
		return s.Size(), nil
	}
	return 0, errors.New("unknown size")
}
