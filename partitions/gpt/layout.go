// Package gpt reads, checks and writes the GUID partition tables of kiln's
// disks and sticks: a disk's layout as kiln inspect shows it (each
// partition's filesystem and label detected from its first bytes), both
// copies of the table checked against each other, the table of a new disk
// or stick written, and the GUIDs kiln derives from its inputs.
package gpt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"

	diskgpt "github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// Filesystems detected by Inspect from a partition's first bytes.
const (
	FSSquashfs = "squashfs"
	FSExt4     = "ext4" // also ext2/ext3: one magic
	FSVfat     = "vfat"
	FSBundle   = "kiln-bundle" // a kiln upgrade bundle: header, then squashfs
)

// Layout is a disk's partition table, as `kiln inspect` shows it.
type Layout struct {
	Size       int64       `json:"size"`       // disk size, bytes
	SectorSize int         `json:"sectorSize"` // logical sector size, bytes
	GUID       string      `json:"guid"`       // disk GUID
	Partitions []Partition `json:"partitions"` // by number
}

// Partition is one GPT partition.
type Partition struct {
	Number     int    `json:"number"`
	Name       string `json:"name"` // GPT partition name
	Type       string `json:"type"` // type GUID, upper case
	GUID       string `json:"guid"` // unique partition GUID, upper case
	FirstLBA   uint64 `json:"firstLBA"`
	LastLBA    uint64 `json:"lastLBA"`
	Offset     int64  `json:"offset"` // bytes from the start of the disk
	Size       int64  `json:"size"`   // bytes
	Filesystem string `json:"filesystem,omitempty"`
	Label      string `json:"label,omitempty"` // filesystem label

	Attributes uint64 `json:"attributes,omitempty"` // GPT attribute bits
}

// Find returns the partition with GPT name or filesystem label name.
// The GPT name wins when both match different partitions.
func (l *Layout) Find(name string) (*Partition, bool) {
	for i := range l.Partitions {
		if l.Partitions[i].Name == name {
			return &l.Partitions[i], true
		}
	}
	for i := range l.Partitions {
		if l.Partitions[i].Label == name {
			return &l.Partitions[i], true
		}
	}
	return nil, false
}

// Names lists the partitions for error messages: "1 EFI-SYSTEM, 2 root".
func (l *Layout) Names() string {
	var s []string
	for _, p := range l.Partitions {
		n := fmt.Sprintf("%d %q", p.Number, p.Name)
		if p.Label != "" && p.Label != p.Name {
			n += fmt.Sprintf(" (filesystem label %q)", p.Label)
		}
		s = append(s, n)
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// Inspect reads the partition table of the disk image at path and checks it:
// primary and backup GPT present, partitions inside the usable area and not
// overlapping. It needs only read access.
func Inspect(path string) (*Layout, error) {
	f, err := OpenDisk(path)
	if err != nil {
		return nil, fmt.Errorf("inspect disk: %w", err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd) // Stat says 0 for block devices
	if err != nil {
		return nil, fmt.Errorf("inspect disk: %w", err)
	}
	l, t, err := readLayout(f, path)
	if err != nil {
		return nil, err
	}
	l.Size = size
	if err := checkBackup(f, l, t); err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	if err := l.check(t); err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	if err := l.CheckOne(contract.PartitionName); err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	return l, nil
}

// CheckOne refuses a layout with more than one partition named name. kiln
// adds one, and finds it by that name: of two, inspect and verify would
// each show one and say nothing of the other, and nothing on the disk
// tells which one a node would serve.
func (l *Layout) CheckOne(name string) error {
	var numbers []string
	for _, p := range l.Partitions {
		if p.Name == name {
			numbers = append(numbers, strconv.Itoa(p.Number))
		}
	}
	if len(numbers) > 1 {
		return fmt.Errorf("partitions %s are all named %s, where kiln writes one: the disk was changed after its build, or not built by kiln; rebuild or reflash it",
			strings.Join(numbers, " and "), name)
	}
	return nil
}

// OpenDisk opens a disk image or device to read (inputfile: a FIFO or a
// directory is refused at once, with what to give instead).
func OpenDisk(path string) (*os.File, error) {
	f, err := inputfile.Open(path)
	if errors.Is(err, inputfile.ErrNotFile) {
		return nil, fmt.Errorf("%w; give a disk image file or a disk device (e.g. /dev/sdX)", err)
	}
	return f, err
}

// Read reads the primary GPT of r, which holds at least the first MiB of a
// disk, and detects the filesystem of each partition whose start r holds;
// name names r in errors. Unlike Inspect, it checks nothing else.
func Read(r io.ReaderAt, name string) (*Layout, error) {
	l, _, err := readLayout(r, name)
	return l, err
}

func readLayout(r io.ReaderAt, name string) (*Layout, *diskgpt.Table, error) {
	sector, err := SectorSize(r)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	t, err := diskgpt.Read(readerFile{r}, sector, sector)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: read partition table: %w", name, err)
	}
	l := &Layout{SectorSize: sector, GUID: strings.ToUpper(t.GUID)}
	for _, p := range t.Partitions {
		if p.Type == diskgpt.Unused {
			continue
		}
		part := Partition{
			Number:   p.Index,
			Name:     p.Name,
			Type:     strings.ToUpper(string(p.Type)),
			GUID:     strings.ToUpper(p.GUID),
			FirstLBA: p.Start,
			LastLBA:  p.End,
			Offset:   int64(p.Start) * int64(sector),
			Size:     int64(p.End-p.Start+1) * int64(sector),

			Attributes: p.Attributes,
		}
		part.Filesystem, part.Label = detectFS(io.NewSectionReader(r, part.Offset, part.Size))
		l.Partitions = append(l.Partitions, part)
	}
	sort.Slice(l.Partitions, func(i, j int) bool { return l.Partitions[i].Number < l.Partitions[j].Number })
	return l, t, nil
}

// SectorSize finds the GPT header: at 512 on most disks, at 4096 on 4Kn ones.
func SectorSize(r io.ReaderAt) (int, error) {
	for _, s := range []int{512, 4096} {
		b := make([]byte, 8)
		if _, err := r.ReadAt(b, int64(s)); err == nil && string(b) == "EFI PART" {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%w (no \"EFI PART\" header at byte 512 or 4096); the base must be a GPT disk image such as a CoreOS metal image", ErrNoPartitionTable)
}

// ErrNoPartitionTable: no GPT header where a GPT disk has one.
var ErrNoPartitionTable = errors.New("no GPT partition table")

// ReadTable reads the primary GPT of the disk at path and nothing else:
// what a file is (a kiln disk, a stick) can be told from it even when the
// rest of the disk is damaged or cut short, which Inspect then reports.
// A file with no GPT at all is an error wrapping ErrNoPartitionTable.
func ReadTable(path string) (*Layout, error) {
	f, err := OpenDisk(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f, path)
}

// check validates the partitions against the usable area and each other.
func (l *Layout) check(t *diskgpt.Table) error {
	last := t.LastDataSector()
	ps := append([]Partition(nil), l.Partitions...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].FirstLBA < ps[j].FirstLBA })
	for i, p := range ps {
		if p.LastLBA < p.FirstLBA || p.LastLBA > last {
			return fmt.Errorf("partition %d %q (LBA %d-%d) lies outside the usable area (last usable LBA %d)", p.Number, p.Name, p.FirstLBA, p.LastLBA, last)
		}
		if i > 0 && p.FirstLBA <= ps[i-1].LastLBA {
			return fmt.Errorf("partitions %d %q and %d %q overlap", ps[i-1].Number, ps[i-1].Name, p.Number, p.Name)
		}
	}
	return nil
}

// checkBackup checks the backup GPT header is where the primary says
// (the last sector of an image file; earlier on a device the image was
// flashed to, until the OS moves it) and points back at the primary.
func checkBackup(r io.ReaderAt, l *Layout, t *diskgpt.Table) error {
	sector := int64(l.SectorSize)
	b := make([]byte, 92)
	if _, err := r.ReadAt(b, sector); err != nil {
		return fmt.Errorf("read GPT header: %w", err)
	}
	alt := int64(binary.LittleEndian.Uint64(b[32:40]))
	if alt <= 1 {
		return fmt.Errorf("the GPT header says its backup is at LBA %d, which cannot be: the header is damaged (sgdisk -v shows details)", alt)
	}
	if want := (alt + 1) * sector; want > l.Size {
		return Truncated(l.Size, want)
	}
	if _, err := r.ReadAt(b, alt*sector); err != nil {
		return fmt.Errorf("read backup GPT header: %w", err)
	}
	if string(b[:8]) != "EFI PART" || int64(binary.LittleEndian.Uint64(b[24:32])) != alt || binary.LittleEndian.Uint64(b[32:40]) != 1 {
		return fmt.Errorf("no valid backup GPT header at LBA %d: the disk image is damaged (sgdisk -v shows details)", alt)
	}
	return nil
}

// detectFS names the filesystem at the start of r and its label.
func detectFS(r io.ReaderAt) (fsType, label string) {
	b := make([]byte, 2048)
	n, _ := r.ReadAt(b, 0)
	b = b[:n]
	switch {
	case len(b) >= 8 && string(b[:8]) == bundlefmt.Magic:
		return FSBundle, ""
	case len(b) >= 4 && string(b[:4]) == "hsqs":
		return FSSquashfs, ""
	case len(b) >= 1024+136 && binary.LittleEndian.Uint16(b[1024+56:]) == 0xEF53:
		return FSExt4, cstr(b[1024+120 : 1024+136])
	case len(b) >= 512 && b[510] == 0x55 && b[511] == 0xAA && string(b[82:87]) == "FAT32":
		return FSVfat, fatLabel(b[71:82])
	case len(b) >= 512 && b[510] == 0x55 && b[511] == 0xAA && string(b[54:57]) == "FAT":
		return FSVfat, fatLabel(b[43:54])
	}
	return "", ""
}

func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func fatLabel(b []byte) string {
	l := strings.TrimRight(string(b), " ")
	if l == "NO NAME" {
		return ""
	}
	return l
}

// readerFile adapts an io.ReaderAt to the file interface go-diskfs reads
// partition tables from. Only ReadAt is used for a good primary GPT.
type readerFile struct{ io.ReaderAt }

func (readerFile) Stat() (fs.FileInfo, error) { return nil, errors.New("no stat") }
func (readerFile) Read([]byte) (int, error)   { return 0, errors.New("no sequential read") }
func (readerFile) Close() error               { return nil }
func (readerFile) Seek(int64, int) (int64, error) {
	// go-diskfs seeks only to read the backup after a bad primary.
	return 0, errors.New("the primary GPT header or its partition entries are damaged (CRC mismatch); kiln disks must be exact: reflash it (sgdisk -v shows details)")
}

// Truncated says a disk of size bytes is short of the want bytes its GPT
// (or seal) says it was built with, and by how much.
func Truncated(size, want int64) error {
	missing := fmt.Sprintf("%d bytes", want-size)
	if want-size == 1 {
		missing = "1 byte"
	}
	return fmt.Errorf("it is truncated: %d bytes of the %d it was built with (%s missing: copied or downloaded only in part?); copy it again, or rebuild it",
		size, want, missing)
}
