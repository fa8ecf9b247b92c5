// Package regindex is the node registry's index of an OCI layout: the
// rules by which a layout is served (which names, which manifests, which
// blobs: Walker), the file the factory writes beside the image partition's
// layout so that `kiln serve` need not walk it at start (FileName, Index,
// Encode, Decode), and the factory's builder of that file (Build). The node
// walks a layout without that file by the same Walker, so what the factory
// indexes is what the node would have served.
package regindex

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/opencontainers/go-digest"
)

// FileName is the node registry's index of the partition's OCI layout,
// written by the factory into the layout directory (contract.OCIDir) after
// the layout itself: what `kiln serve` would otherwise learn at start by
// reading, hashing and parsing every manifest. The partition is read-only
// and dm-verity-checked, so the index is as trustworthy as the manifests it
// describes; the registry still checks each manifest's digest when it first
// serves it.
//
// It is binary (Encode documents the format): the node parses it before it
// answers, and JSON's parse of a 2,000-image index alone took
// most of a start that must beat a registry which reads nothing.
const FileName = "kiln-registry-index.bin"

// Version is the version of Index this kiln writes and reads. A registry that meets another version indexes the layout itself.
// Version 1 was JSON, in kiln-registry-index.json; version 2 had no
// checksum, so outside dm-verity a flipped bit could drop images unseen.
const Version = 3

// magicLine opens the file: `head -1` names it.
const magicLine = "kiln registry index\n"

// MaxSize bounds the file a node reads: 2,000 images index to about
// 0.5 MiB.
const MaxSize = 256 << 20

// ErrVersion is returned for a registry index of another version.
var ErrVersion = errors.New("registry index of an unknown version")

// ErrDamaged is returned for a registry index whose checksum does not
// match its contents.
var ErrDamaged = fmt.Errorf("%w: its checksum does not match its contents", contract.ErrDamaged)

// Index is everything the node's registry serves from one OCI layout, as
// Walker finds it. Each digest is held once, in Blobs, and referred to by its position.
type Index struct {
	SchemaVersion int
	// Blobs is the lowercase hex sha256 of every blob served (manifests
	// included), 64 characters each, concatenated, in ascending order.
	// Blob i is Blobs[64*i : 64*i+64]; Sizes[i] is the size its descriptors
	// promise.
	Blobs string
	Sizes []int64
	// MediaTypes are the distinct media types of the manifests.
	MediaTypes []string
	// Manifests are every manifest and index served, in the order of their
	// blobs.
	Manifests []IndexedManifest
	// Images are the layout's named images in index.json order (the first
	// to name a repo:tag wins it); Tag is empty for an image named by digest.
	Images []IndexedImage
}

// IndexedImage is one name under which a manifest is served.
type IndexedImage struct {
	Repository string
	Tag        string
	Manifest   int // position in Manifests
}

// IndexedManifest is one manifest or index: what is needed to answer for it
// without reading it (its bytes are read on first request).
type IndexedManifest struct {
	Blob         int               // its own bytes: position in Blobs
	MediaType    int               // position in MediaTypes
	ArtifactType string            // for referrers
	Annotations  map[string]string // for referrers
	Subject      string            // digest of the manifest it refers to
	Children     []int             // an index's manifests in the layout: positions in Manifests
	Layers       []int             // config and layers: positions in Blobs
}

// BlobCount is how many blobs the index holds (len(Sizes)).
func (ix *Index) BlobCount() int { return len(ix.Sizes) }

// BlobDigest is blob i's digest, "sha256:<hex>"; i must be below
// BlobCount.
func (ix *Index) BlobDigest(i int) string {
	return digest.NewDigestFromEncoded(digest.SHA256, ix.Blobs[64*i:64*i+64]).String()
}

// Encode returns FileName's bytes. The format, after the magic line
// "kiln registry index\n", is a sequence of unsigned varints
// (encoding/binary's) and strings (a varint length, then the bytes):
//
//	version
//	the CRC-32C of everything after it (4 bytes, big-endian)
//	n, then n raw sha256 digests (32 bytes each, ascending), then n sizes
//	media type count, then the media types
//	manifest count, then per manifest: blob, media type, artifact type,
//	  subject, annotation count and key, value pairs (keys ascending),
//	  child count and children, layer count and layers
//	image count, then per image: repository, tag, manifest
//
// The same index always gives the same bytes (the partition is
// reproducible). Blobs must be 64 hex characters per size.
//
// The checksum is there for an index read outside dm-verity (a layout
// directory, a partition built without verity): the reader sees damage to
// the file (every flipped bit, every burst up to 32 bits, anything else
// but once in 2^32) instead of parsing it into a smaller index that
// silently serves fewer images. It finds damage, it does not authenticate:
// whoever can rewrite the index can rewrite the layout it summarises, and
// the image partition's authenticity is dm-verity's and kiln verify's job.
// CRC-32C, not sha256: 0.03 ms for a 2,000-image index where sha256 took
// 0.8 ms, a start being about 10 ms.
func Encode(ix *Index) ([]byte, error) {
	n := ix.BlobCount()
	raw, err := hex.DecodeString(ix.Blobs)
	if err != nil || len(raw) != 32*n {
		return nil, fmt.Errorf("encode registry index: blobs are not %d sha256 digests in hex", n)
	}
	e := &indexEncoder{b: make([]byte, 0, len(raw)+16*n+64*len(ix.Manifests))}
	e.uint(uint64(n))
	e.b = append(e.b, raw...)
	for _, s := range ix.Sizes {
		e.int(int64(s))
	}
	e.uint(uint64(len(ix.MediaTypes)))
	for _, mt := range ix.MediaTypes {
		e.string(mt)
	}
	e.uint(uint64(len(ix.Manifests)))
	for _, m := range ix.Manifests {
		e.int(int64(m.Blob))
		e.int(int64(m.MediaType))
		e.string(m.ArtifactType)
		e.string(m.Subject)
		keys := make([]string, 0, len(m.Annotations))
		for k := range m.Annotations {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		e.uint(uint64(len(keys)))
		for _, k := range keys {
			e.string(k)
			e.string(m.Annotations[k])
		}
		e.ints(m.Children)
		e.ints(m.Layers)
	}
	e.uint(uint64(len(ix.Images)))
	for _, im := range ix.Images {
		e.string(im.Repository)
		e.string(im.Tag)
		e.int(int64(im.Manifest))
	}
	if e.err != nil {
		return nil, fmt.Errorf("encode registry index: %w", e.err)
	}
	return seal(ix.SchemaVersion, e.b), nil
}

// seal is the file holding payload: the magic line, the version, then the
// payload's checksum and the payload.
func seal(version int, payload []byte) []byte {
	b := make([]byte, 0, len(magicLine)+binary.MaxVarintLen64+4+len(payload))
	b = append(b, magicLine...)
	b = binary.AppendUvarint(b, uint64(version))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(payload, castagnoli))
	return append(b, payload...)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type indexEncoder struct {
	b   []byte
	err error
}

func (e *indexEncoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }

// int writes a size or a position, which are never negative.
func (e *indexEncoder) int(v int64) {
	if v < 0 && e.err == nil {
		e.err = fmt.Errorf("negative size or position %d", v)
	}
	e.uint(uint64(v))
}

func (e *indexEncoder) ints(vs []int) {
	e.uint(uint64(len(vs)))
	for _, v := range vs {
		e.int(int64(v))
	}
}

func (e *indexEncoder) string(s string) {
	e.uint(uint64(len(s)))
	e.b = append(e.b, s...)
}

// Decode parses FileName's bytes. Another schema version is ErrVersion
// (wrapped), contents that do not match the checksum ErrDamaged (wrapped);
// anything else that is not an index this kiln wrote (truncated, trailing bytes, a count larger than
// the file) is an error, never a panic or a huge allocation. Positions are
// not checked against their lists: the reader does that.
func Decode(data []byte) (*Index, error) {
	ix, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", FileName, err)
	}
	return ix, nil
}

func decode(data []byte) (*Index, error) {
	if len(data) < len(magicLine) || string(data[:len(magicLine)]) != magicLine {
		return nil, errors.New("not a kiln registry index (no magic line)")
	}
	// One string holds every name the index has: each is a slice of it,
	// not an allocation of its own (a start reads thousands).
	d := &indexDecoder{s: string(data[len(magicLine):])}
	ix := &Index{SchemaVersion: d.int()}
	if d.err == nil && ix.SchemaVersion != Version {
		return nil, fmt.Errorf("schema version %d, this kiln reads %d: %w", ix.SchemaVersion, Version, ErrVersion)
	}
	sum := d.bytes(4)
	if d.err != nil {
		return nil, d.err
	}
	// Summed where it lies (d.s is a string, a []byte of it a copy).
	if crc32.Checksum(data[len(data)-len(d.s):], castagnoli) != binary.BigEndian.Uint32([]byte(sum)) {
		return nil, ErrDamaged
	}
	n := d.count(32)
	ix.Blobs = hexDigests(d.bytes(32 * n))
	ix.Sizes = make([]int64, n)
	for i := range ix.Sizes {
		ix.Sizes[i] = int64(d.int())
	}
	ix.MediaTypes = make([]string, d.count(1))
	for i := range ix.MediaTypes {
		ix.MediaTypes[i] = d.string()
	}
	ix.Manifests = make([]IndexedManifest, d.count(6))
	var positions []int // every manifest's children and layers, in one array
	for i := range ix.Manifests {
		m := &ix.Manifests[i]
		m.Blob, m.MediaType, m.ArtifactType, m.Subject = d.int(), d.int(), d.string(), d.string()
		if na := d.count(2); na > 0 {
			m.Annotations = make(map[string]string, na)
			for j := 0; j < na; j++ {
				k := d.string()
				m.Annotations[k] = d.string()
			}
		}
		for _, list := range []*[]int{&m.Children, &m.Layers} {
			c := d.count(1)
			if c == 0 {
				continue
			}
			if cap(positions)-len(positions) < c {
				positions = make([]int, 0, max(c, 4096))
			}
			start := len(positions)
			for j := 0; j < c; j++ {
				positions = append(positions, d.int())
			}
			*list = positions[start:len(positions):len(positions)]
		}
	}
	ix.Images = make([]IndexedImage, d.count(3))
	for i := range ix.Images {
		ix.Images[i] = IndexedImage{Repository: d.string(), Tag: d.string(), Manifest: d.int()}
	}
	if d.err == nil && len(d.s) > 0 {
		d.err = fmt.Errorf("%d bytes after the last image", len(d.s))
	}
	if d.err != nil {
		return nil, d.err
	}
	return ix, nil
}

// hexDigests is raw's sha256 digests in hex, concatenated: written straight
// into the one string kept (hex.EncodeToString would allocate it twice, and
// a start feels every fresh megabyte).
func hexDigests(raw string) string {
	var b strings.Builder
	b.Grow(2 * len(raw))
	var buf [64]byte
	for i := 0; i+32 <= len(raw); i += 32 {
		hex.Encode(buf[:], []byte(raw[i:i+32]))
		b.Write(buf[:])
	}
	return b.String()
}

// indexDecoder reads the encoder's varints and strings from s; the first
// error sticks and every later read returns zero.
type indexDecoder struct {
	s   string
	err error
}

func (d *indexDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("truncated or damaged: %s", what)
	}
	d.s = ""
}

// uint is binary.Uvarint over the string every name is sliced from
// (Uvarint takes a []byte, and converting would copy).
func (d *indexDecoder) uint() uint64 {
	var v uint64
	for i := 0; i < len(d.s) && i < binary.MaxVarintLen64; i++ {
		c := d.s[i]
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				break
			}
			d.s = d.s[i+1:]
			return v | uint64(c)<<(7*i)
		}
		v |= uint64(c&0x7f) << (7 * i)
	}
	d.fail("a number")
	return 0
}

// int reads a size or a position: it must fit an int.
func (d *indexDecoder) int() int {
	v := d.uint()
	if v > math.MaxInt64 || uint64(int(v)) != v {
		d.fail("a number out of range")
		return 0
	}
	return int(v)
}

// count reads a list's length, each entry at least min bytes long: a
// length the rest of the file cannot hold is damage, not an allocation.
func (d *indexDecoder) count(min int) int {
	c := d.uint()
	if c > uint64(len(d.s)/min) {
		d.fail("a list longer than the file")
		return 0
	}
	return int(c)
}

func (d *indexDecoder) bytes(n int) string {
	if n > len(d.s) {
		d.fail("a string longer than the file")
		return ""
	}
	s := d.s[:n]
	d.s = d.s[n:]
	return s
}

func (d *indexDecoder) string() string { return d.bytes(d.count(1)) }
