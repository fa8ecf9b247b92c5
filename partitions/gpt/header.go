package gpt

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
)

// HeaderLBAs returns the LBAs of the primary and backup GPT headers, as the
// primary says.
func HeaderLBAs(r io.ReaderAt, sector int64) (primary, backup int64, err error) {
	b := make([]byte, 92)
	if _, err := r.ReadAt(b, sector); err != nil {
		return 0, 0, fmt.Errorf("read GPT header: %w", err)
	}
	return 1, int64(binary.LittleEndian.Uint64(b[32:40])), nil
}

// Copy is one GPT header and its entry array, CRCs checked.
type Copy struct {
	Alternate int64 // the LBA of the other copy's header
	Entries   []byte
}

// ReadCopy reads the GPT header at lba of a disk of size bytes and its
// entries, checking both CRCs and that the header says it is at lba.
func ReadCopy(r io.ReaderAt, lba, sector, size int64) (*Copy, error) {
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
	return &Copy{Alternate: int64(binary.LittleEndian.Uint64(h[32:40])), Entries: ents}, nil
}
