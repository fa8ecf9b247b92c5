// Package slot is the format that describes a slot image (an A/B partition's
// bytes: an OS tree with its verity data, a kernel and initramfs) as
// content-defined chunks, shared by the factory that cuts it and the node that
// writes it into its inactive slot.
//
// A delta is what a new slot image has that the node's active slot lacks.
// Both are described by an Index; the factory's bundle carries the new
// Index, the base's Index and, in a Pack, every chunk of the new one whose
// digest the base lacks, each once, in the order the new Index first names
// it. The node recomputes that order from the two indexes (Lacking), so the
// pack needs no table of its own, and takes every other chunk from its active
// slot, where the base Index says it lies. Every chunk is checked against its
// digest before it is written, wherever it came from.
//
// An Index is binary (Encode documents it): a 4 GiB slot cut into 64 KiB
// chunks has 65,536 entries, 2.3 MiB here and three times that as JSON.
// Its integrity comes from the signed manifest that names its sha256.
package slot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"regexp"
)

// Chunk is one piece of a slot image.
type Chunk struct {
	Digest [sha256.Size]byte // sha256 of its bytes
	Size   uint32
}

// Params are the content-defined chunker's: the factory records them so a
// later build can cut the next release the same way (chunks that did not
// change then get the same boundaries and digests).
type Params struct {
	Polynomial  uint64 // an irreducible polynomial of degree 53 (Rabin fingerprint)
	MinSize     uint32 // no chunk but the last is smaller
	MaxSize     uint32 // no chunk is larger
	AverageBits uint8  // a boundary where the fingerprint's low AverageBits bits are zero
}

// Index describes a slot image.
type Index struct {
	Params Params
	Size   int64   // bytes of the image: the sum of the chunks' sizes
	Chunks []Chunk // in image order
}

// Limits of what Decode accepts.
const (
	// MaxImageSize bounds a slot image (a whole OS partition fits many times).
	MaxImageSize = 1 << 40
	// MinChunkSize bounds Params.MinSize from below, so an index's length is
	// bounded by its image's size.
	MinChunkSize = 4 << 10
	// MaxChunkSize bounds Params.MaxSize: a chunk is held in memory whole.
	MaxChunkSize = 16 << 20
)

const (
	magic   = "kiln slot index\n"
	version = 1
	// headerSize: magic, version (u32), polynomial (u64), min, max (u32),
	// average bits (u8, then 3 zero bytes), size (i64), count (u32).
	headerSize = len(magic) + 4 + 8 + 4 + 4 + 4 + 8 + 4
	entrySize  = 4 + sha256.Size
)

// ErrVersion is returned for an index of another version.
var ErrVersion = errors.New("slot index of an unknown version")

// Encode writes the index:
//
//	"kiln slot index\n"
//	version u32 | polynomial u64 | min u32 | max u32 | average bits u8, 3 zero bytes
//	image size i64 | chunk count u32
//	count × (size u32 | sha256 [32]byte)
//
// all integers little-endian.
func (x *Index) Encode(w io.Writer) error {
	if err := x.Check(); err != nil {
		return err
	}
	b := make([]byte, 0, headerSize+entrySize*len(x.Chunks))
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint32(b, version)
	b = binary.LittleEndian.AppendUint64(b, x.Params.Polynomial)
	b = binary.LittleEndian.AppendUint32(b, x.Params.MinSize)
	b = binary.LittleEndian.AppendUint32(b, x.Params.MaxSize)
	b = append(b, x.Params.AverageBits, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(x.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(x.Chunks)))
	for _, c := range x.Chunks {
		b = binary.LittleEndian.AppendUint32(b, c.Size)
		b = append(b, c.Digest[:]...)
	}
	_, err := w.Write(b)
	return err
}

// Decode reads an index Encode wrote, reading no more than such an index can
// be (its header bounds it), and checks it.
func Decode(r io.Reader) (*Index, error) {
	h := make([]byte, headerSize)
	if _, err := io.ReadFull(r, h); err != nil {
		return nil, fmt.Errorf("slot index: header: %w", short(err))
	}
	if string(h[:len(magic)]) != magic {
		return nil, errors.New("slot index: not a kiln slot index (bad magic)")
	}
	le := binary.LittleEndian
	p := h[len(magic):]
	if v := le.Uint32(p); v != version {
		return nil, fmt.Errorf("%w: version %d, this kiln reads %d", ErrVersion, v, version)
	}
	x := &Index{Params: Params{
		Polynomial:  le.Uint64(p[4:]),
		MinSize:     le.Uint32(p[12:]),
		MaxSize:     le.Uint32(p[16:]),
		AverageBits: p[20],
	}}
	if p[21] != 0 || p[22] != 0 || p[23] != 0 {
		return nil, errors.New("slot index: header padding is not zero")
	}
	x.Size = int64(le.Uint64(p[24:]))
	n := le.Uint32(p[32:])
	if err := x.checkParams(); err != nil {
		return nil, err
	}
	if want := x.maxChunks(); int64(n) > want {
		return nil, fmt.Errorf("slot index: %d chunks for %d bytes of at least %d each: damaged", n, x.Size, x.Params.MinSize)
	}
	body := make([]byte, int(n)*entrySize)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("slot index: chunk list: %w", short(err))
	}
	x.Chunks = make([]Chunk, n)
	for i := range x.Chunks {
		e := body[i*entrySize:]
		x.Chunks[i].Size = le.Uint32(e)
		copy(x.Chunks[i].Digest[:], e[4:entrySize])
	}
	if err := x.Check(); err != nil {
		return nil, err
	}
	if extra, _ := r.Read(make([]byte, 1)); extra != 0 {
		return nil, errors.New("slot index: bytes after the chunk list: damaged")
	}
	return x, nil
}

func short(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return errors.New("truncated")
	}
	return err
}

func (x *Index) checkParams() error {
	p := x.Params
	switch {
	case p.MinSize < MinChunkSize:
		return fmt.Errorf("slot index: minimum chunk size %d is below %d", p.MinSize, MinChunkSize)
	case p.MaxSize > MaxChunkSize || p.MaxSize < p.MinSize:
		return fmt.Errorf("slot index: maximum chunk size %d is not between %d and %d", p.MaxSize, p.MinSize, MaxChunkSize)
	case p.AverageBits == 0 || p.AverageBits > 30:
		return fmt.Errorf("slot index: average bits %d is not between 1 and 30", p.AverageBits)
	case x.Size < 0 || x.Size > MaxImageSize:
		return fmt.Errorf("slot index: image size %d is not between 0 and %d", x.Size, int64(MaxImageSize))
	}
	return nil
}

// maxChunks is how many chunks an image of x.Size can have.
func (x *Index) maxChunks() int64 { return x.Size/int64(x.Params.MinSize) + 1 }

// Check says whether the index is one a chunker with its Params could have
// cut: sizes within bounds (the last chunk may be short), adding up to Size.
func (x *Index) Check() error {
	if err := x.checkParams(); err != nil {
		return err
	}
	if int64(len(x.Chunks)) > x.maxChunks() {
		return fmt.Errorf("slot index: %d chunks for %d bytes", len(x.Chunks), x.Size)
	}
	var sum int64
	for i, c := range x.Chunks {
		last := i == len(x.Chunks)-1
		if c.Size == 0 || c.Size > x.Params.MaxSize || (!last && c.Size < x.Params.MinSize) {
			return fmt.Errorf("slot index: chunk %d is %d bytes, not between %d and %d", i, c.Size, x.Params.MinSize, x.Params.MaxSize)
		}
		sum += int64(c.Size)
	}
	if sum != x.Size {
		return fmt.Errorf("slot index: chunks add up to %d bytes, the image is %d", sum, x.Size)
	}
	return nil
}

// Digest is the sha256 of the index's encoding: what a signed manifest names.
func (x *Index) Digest() ([sha256.Size]byte, error) {
	var b bytes.Buffer
	if err := x.Encode(&b); err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b.Bytes()), nil
}

// Located is a chunk with where it lies.
type Located struct {
	Chunk
	Offset int64
}

// Locate maps each distinct digest of x to where it first lies in its image.
func (x *Index) Locate() map[[sha256.Size]byte]Located {
	m := make(map[[sha256.Size]byte]Located, len(x.Chunks))
	var off int64
	for _, c := range x.Chunks {
		if _, ok := m[c.Digest]; !ok {
			m[c.Digest] = Located{c, off}
		}
		off += int64(c.Size)
	}
	return m
}

// Lacking is the Pack's contents for a delta from base to x: each chunk of x
// whose digest base does not have, once, in the order x first names it, at
// its offset in the pack. A nil base lacks everything.
func Lacking(x, base *Index) []Located { return LackingAny(x, base) }

// LackingAny is the Pack's contents for a delta that applies to several
// bases (a node of any of them takes it): each chunk of x whose digest one
// of bases lacks, once, in the order x first names it. A nil base lacks
// everything; so do no bases at all (a full pack). With one base it is
// Lacking.
func LackingAny(x *Index, bases ...*Index) []Located {
	have := map[[sha256.Size]byte]int{} // how many bases hold each digest
	for _, b := range bases {
		if b == nil {
			have = nil
			break
		}
		for d := range b.Locate() {
			have[d]++
		}
	}
	seen := make(map[[sha256.Size]byte]bool)
	var out []Located
	var off int64
	for _, c := range x.Chunks {
		if (len(bases) > 0 && have[c.Digest] == len(bases)) || seen[c.Digest] {
			continue
		}
		seen[c.Digest] = true
		out = append(out, Located{c, off})
		off += int64(c.Size)
	}
	return out
}

// PackSize is the size of a pack of the chunks.
func PackSize(chunks []Located) int64 {
	if len(chunks) == 0 {
		return 0
	}
	last := chunks[len(chunks)-1]
	return last.Offset + int64(last.Size)
}

// Verity is how the factory formatted a slot's dm-verity hash partition
// (sha256, 4 KiB blocks, format 1, as veritysetup's defaults). The hash
// partition never travels: the node formats its inactive slot's with these
// values once the data is written, and the root hash must come out as the
// signed one — the proof that the slot holds exactly the factory's bytes.
type Verity struct {
	RootHash   string `json:"rootHash"`   // hex sha256
	Salt       string `json:"salt"`       // hex
	UUID       string `json:"uuid"`       // of the verity superblock
	DataBlocks int64  `json:"dataBlocks"` // 4 KiB blocks of the slot image
}

// VerityBlock is the data and hash block size.
const VerityBlock = 4096

// HashSize is what veritysetup format writes into the hash partition for
// the slot: the superblock's block and every level of the tree (128 sha256
// digests a block), so the partition must hold at least this.
func (v Verity) HashSize() int64 {
	const perBlock = VerityBlock / sha256.Size
	blocks := int64(1)
	for n := v.DataBlocks; n > 1; {
		n = (n + perBlock - 1) / perBlock
		blocks += n
	}
	return blocks * VerityBlock
}

var (
	hexDigits = regexp.MustCompile(`^[0-9a-f]*$`)
	uuidForm  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// Check says whether the values can be handed to veritysetup as they are.
func (v Verity) Check() error {
	switch {
	case len(v.RootHash) != 2*sha256.Size || !hexDigits.MatchString(v.RootHash):
		return fmt.Errorf("slot verity: root hash %q is not 64 lowercase hex digits", v.RootHash)
	case len(v.Salt) > 512 || len(v.Salt)%2 != 0 || !hexDigits.MatchString(v.Salt):
		return fmt.Errorf("slot verity: salt %q is not lowercase hex of at most 256 bytes", v.Salt)
	case !uuidForm.MatchString(v.UUID):
		return fmt.Errorf("slot verity: UUID %q", v.UUID)
	case v.DataBlocks <= 0 || v.DataBlocks > MaxImageSize/VerityBlock:
		return fmt.Errorf("slot verity: %d data blocks", v.DataBlocks)
	}
	return nil
}
