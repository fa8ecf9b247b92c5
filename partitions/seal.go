package partitions

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/uuid"
)

// The seal is kiln's record of every byte it wrote to a disk: the last
// SealSize bytes of the image partition. It travels with the disk (flashing
// copies it) and cannot be edited along with what it describes without
// showing: its sha256 is the disk GUID in both GPT headers, and what it
// describes includes the GPT entries, every partition (boot with the
// Ignition config that carries the verity root hash) and the image
// partition's verity tree, whose root hash is also that partition's GUID.
// See docs/decisions.md.
const (
	SealSize      = 64 << 10
	sealMagic     = "KILNSEAL"
	SealVersion   = 3
	sealHeaderLen = len(sealMagic) + 4 // magic, uint32 length of the JSON
)

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
	Outside    string          `json:"outside"`
	Partitions []SealPartition `json:"partitions"` // by number, the image partition included
	Image      SealImage       `json:"image"`
}

// SealPartition is one GPT entry as built, and the sha256 of its bytes
// ("" for the image partition, which Image describes).
type SealPartition struct {
	Number     int    `json:"number"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	GUID       string `json:"guid"`
	FirstLBA   uint64 `json:"firstLBA"`
	LastLBA    uint64 `json:"lastLBA"`
	Attributes uint64 `json:"attributes,omitempty"`
	Digest     string `json:"digest,omitempty"`
}

// SealImage describes the image partition: its squashfs, its verity tree
// (nil when the recipe turns verity off), and the sha256 of the bytes
// from DigestFrom to the seal (everything verity does not cover).
type SealImage struct {
	FSSize     int64   `json:"fsSize"` // squashfs bytes, 4 KiB aligned
	Verity     *Verity `json:"verity,omitempty"`
	DigestFrom int64   `json:"digestFrom"`
	Digest     string  `json:"digest"`
}

// encodeSeal lays s out in its SealSize area.
func encodeSeal(s *Seal) ([]byte, error) {
	js, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if sealHeaderLen+len(js) > SealSize {
		return nil, fmt.Errorf("seal record is %d bytes, more than the %d kiln reserves", len(js), SealSize-sealHeaderLen)
	}
	b := make([]byte, SealSize)
	copy(b, sealMagic)
	binary.LittleEndian.PutUint32(b[len(sealMagic):], uint32(len(js)))
	copy(b[sealHeaderLen:], js)
	return b, nil
}

// decodeSeal parses a SealSize area; any damage is an error, never a panic.
func decodeSeal(b []byte) (*Seal, error) {
	if len(b) != SealSize || string(b[:len(sealMagic)]) != sealMagic {
		return nil, errors.New("no kiln seal record (magic KILNSEAL) at the end of the image partition")
	}
	n := int(binary.LittleEndian.Uint32(b[len(sealMagic):]))
	if n > SealSize-sealHeaderLen {
		return nil, fmt.Errorf("seal record length %d is larger than its area", n)
	}
	var s Seal
	dec := json.NewDecoder(bytes.NewReader(b[sealHeaderLen : sealHeaderLen+n]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("seal record: %w", err)
	}
	if s.SchemaVersion < 1 || s.SchemaVersion > SealVersion {
		return nil, fmt.Errorf("seal record version %d, this kiln reads 1 to %d", s.SchemaVersion, SealVersion)
	}
	return &s, nil
}

// SealGUID is the disk GUID for a seal area: the first 128 bits of its
// sha256, upper case as Layout shows GUIDs.
func SealGUID(area []byte) string {
	sum := sha256.Sum256(area)
	return guidOf(sum[:16])
}

// RootHashGUID is the image partition's GUID when verity is on: the first
// 128 bits of the root hash, the Discoverable Partitions Specification's
// convention, so the GUID names the content.
func RootHashGUID(rootHash string) (string, error) {
	b, err := hex.DecodeString(rootHash)
	if err != nil || len(b) < 16 {
		return "", fmt.Errorf("root hash %q is not hex of at least 16 bytes", rootHash)
	}
	return guidOf(b[:16]), nil
}

func guidOf(b []byte) string {
	var u uuid.UUID
	copy(u[:], b)
	return strings.ToUpper(u.String())
}

// gptHeaderSectors returns the LBAs of the primary and backup GPT headers.
func gptHeaderSectors(r io.ReaderAt, sector int64) (primary, backup int64, err error) {
	b := make([]byte, 92)
	if _, err := r.ReadAt(b, sector); err != nil {
		return 0, 0, fmt.Errorf("read GPT header: %w", err)
	}
	return 1, int64(binary.LittleEndian.Uint64(b[32:40])), nil
}

// fullHeaderSectors is the first seal version whose GPTHeaders covers the
// header sectors whole: a bit flipped in the reserved rest of either sector
// (bytes 92 to the sector's end) verified as OK before.
const fullHeaderSectors = 3

// headerDigest hashes both GPT header sectors (only their first 92 bytes
// before fullHeaderSectors) without their CRC and disk GUID.
func headerDigest(version int, r io.ReaderAt, sector int64) (string, error) {
	p, b, err := gptHeaderSectors(r, sector)
	if err != nil {
		return "", err
	}
	n := sector
	if version < fullHeaderSectors {
		n = 92
	}
	h := sha256.New()
	for _, lba := range []int64{p, b} {
		hdr := make([]byte, n)
		if _, err := r.ReadAt(hdr, lba*sector); err != nil {
			return "", fmt.Errorf("read GPT header at LBA %d: %w", lba, err)
		}
		clear(hdr[16:20]) // header CRC
		clear(hdr[56:72]) // disk GUID
		h.Write(hdr)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// span is a byte range of the disk.
type span struct{ off, size int64 }

// outsideDigest hashes every byte of the first size bytes of r that lies in
// no partition and in neither GPT header sector.
func outsideDigest(ctx context.Context, version int, r io.ReaderAt, size, sector int64, parts []Partition, skip ...int64) (string, error) {
	var inside []span
	for _, p := range parts {
		inside = append(inside, span{p.Offset, p.Size})
	}
	for _, lba := range skip {
		inside = append(inside, span{lba * sector, sector})
	}
	h := newSealHash(version)
	buf := make([]byte, MiB)
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
		if err := hashSpan(ctx, h, r, off, next-off, buf); err != nil {
			return "", err
		}
		off = next
	}
	return h.digest(), nil
}

// hashSpan feeds h size bytes of r at off. A file's holes (the disk file
// kiln writes is sparse: the base's zero runs, the headroom) are hashed
// from zeros in memory rather than read (hashHoles).
func hashSpan(ctx context.Context, h io.Writer, r io.ReaderAt, off, size int64, buf []byte) error {
	// A section past the end of r would read short without an error.
	if end, err := sizeOf(r); err == nil && off+size > end {
		return fmt.Errorf("bytes %d-%d lie past the end of the disk (%d bytes): it is truncated", off, off+size-1, end)
	}
	if f, base, ok := fileOf(r); ok {
		return hashHoles(ctx, h, f, base+off, size, buf)
	}
	return hashRead(ctx, h, r, off, size, buf)
}

// fileOf finds the file under r (a partition's section of the disk file)
// and r's offset in it.
func fileOf(r io.ReaderAt) (*os.File, int64, bool) {
	switch r := r.(type) {
	case *os.File:
		return r, 0, true
	case *offsetFile:
		return r.f, r.off, true
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
