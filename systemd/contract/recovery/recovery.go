// Package recovery is the format of a recovery (reflash) stick (kiln
// reflash-stick), shared by the factory that writes it and the node-edition
// agent that runs from it (kiln agent reflash).
//
// The stick is the recipe's base OS with one more partition, of type
// PartitionType, holding a read-only filesystem:
//
//	/reflash.json   Record: the disk image's size, sha256 and per-chunk digests, and how to pick the target
//	/disk.raw       the appliance disk, byte for byte the factory's (kiln verify accepted it)
//	/bin/kiln       the node edition of kiln, which the stick's unit runs
//	/about.json     About: the disk's kiln.json and which kiln the agent is, for kiln inspect
//	                (the reflash reads none of it; sticks made before 2026-11-26 lack it)
package recovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/opencontainers/go-digest"
)

// PartitionType is the GPT partition type GUID of the stick's payload
// partition. (Random, generated once for kiln; not registered anywhere.)
const PartitionType = "95666EA1-0F80-41F8-881B-F1DC90B31D9E"

// PartitionName is the payload partition's GPT name.
const PartitionName = "kiln-reflash"

// Paths inside the payload partition, and where the stick mounts it.
const (
	RecordFile  = "reflash.json"
	DiskFile    = "disk.raw"
	AgentBinary = "bin/kiln"
	MountPoint  = "/run/kiln/reflash"
	// Unit runs the reflash on the stick's console.
	Unit = "kiln-reflash.service"
)

// AboutFile describes the stick's payload for people: About.
const AboutFile = "about.json"

// About is what `kiln inspect` shows of a stick: the appliance disk it
// carries (its image partition's kiln.json) and its agent. The reflash
// reads only the Record, which alone is checked against every byte it
// writes.
type About struct {
	Disk  contract.Contents `json:"disk"`  // kiln.json of disk.raw's image partition
	Agent version.Info      `json:"agent"` // which kiln bin/kiln is
	Kiln  version.Info      `json:"kiln"`  // the kiln that made the stick
	// SecureBoot records the stick's own signed boot files (as kiln.json
	// does a disk's), when its recipe has secureBoot; nil: the stick boots
	// the base's unsigned entries.
	SecureBoot *contract.SecureBoot `json:"secureBoot,omitempty"`
}

// ChunkSize is the span of each digest in Record.Chunks: a damaged byte is
// located to 4 MiB, and the list stays small (256 entries a GiB).
const ChunkSize = 4 << 20

// maxRecord bounds reflash.json (a 2 TiB disk's chunk list is ~36 MiB).
const maxRecord = 64 << 20

// Record is reflash.json.
type Record struct {
	Size     int64    `json:"size"`     // bytes of disk.raw
	SHA256   string   `json:"sha256"`   // "sha256:" + hex of all of them
	DiskGUID string   `json:"diskGUID"` // the disk GUID kiln inspect shows: the seal's fingerprint
	Chunks   []string `json:"chunks"`   // hex sha256 of each ChunkSize bytes, the last one shorter
	// Target says which disk to write; empty: the one non-removable disk
	// that is neither the stick nor mounted.
	Target Target `json:"target,omitzero"`
	// Unattended: write without asking on the console.
	Unattended bool `json:"unattended,omitempty"`
}

// Target is the recipe's rule for the disk to write (reflash.target).
type Target struct {
	// Path is a glob over device paths, e.g. /dev/disk/by-path/pci-0000:00:1f.2-ata-1
	// or /dev/disk/by-id/nvme-*; symlinks are followed to the disk.
	Path    string `json:"path,omitempty"`
	Model   string `json:"model,omitempty"`   // glob against the disk's model
	MinSize int64  `json:"minSize,omitempty"` // bytes, 0: no bound
	MaxSize int64  `json:"maxSize,omitempty"` // bytes, 0: no bound
}

// IsZero reports an empty rule (the default choice).
func (t Target) IsZero() bool { return t == Target{} }

// String says which disks the rule takes: "path /dev/disk/by-id/nvme-*,
// at least 64.0 GiB", or for the empty rule the default choice.
func (t Target) String() string {
	if t.IsZero() {
		return "the one non-removable disk that is neither the stick nor mounted"
	}
	var parts []string
	if t.Path != "" {
		parts = append(parts, "path "+t.Path)
	}
	if t.Model != "" {
		parts = append(parts, "model "+t.Model)
	}
	if t.MinSize > 0 {
		parts = append(parts, "at least "+human.Bytes(t.MinSize))
	}
	if t.MaxSize > 0 {
		parts = append(parts, "at most "+human.Bytes(t.MaxSize))
	}
	return strings.Join(parts, ", ")
}

// Read reads and checks the record in a mounted payload directory.
func Read(dir string) (*Record, error) {
	p := filepath.Join(dir, RecordFile)
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("reflash record: %w (is %s the stick's %s partition?)", err, dir, PartitionName)
	}
	defer f.Close()
	r, err := Decode(f)
	if err != nil {
		return nil, fmt.Errorf("reflash record %s: %w", p, err)
	}
	return r, nil
}

// Decode reads and checks a record.
func Decode(f io.Reader) (*Record, error) {
	var r Record
	d := json.NewDecoder(io.LimitReader(f, maxRecord))
	d.DisallowUnknownFields()
	if err := d.Decode(&r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *Record) check() error {
	if r.Size <= 0 {
		return fmt.Errorf("size %d: want the disk image's size in bytes", r.Size)
	}
	if want := (r.Size + ChunkSize - 1) / ChunkSize; int64(len(r.Chunks)) != want {
		return fmt.Errorf("%d chunk digests for %d bytes: want %d", len(r.Chunks), r.Size, want)
	}
	if _, err := parseSHA256(r.SHA256); err != nil {
		return err
	}
	for i, c := range r.Chunks {
		if b, err := hex.DecodeString(c); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("chunk %d: digest %q is not 64 hex digits", i, c)
		}
	}
	if r.Target.MinSize < 0 || r.Target.MaxSize < 0 || (r.Target.MaxSize > 0 && r.Target.MaxSize < r.Target.MinSize) {
		return fmt.Errorf("target size bounds %d–%d make no sense", r.Target.MinSize, r.Target.MaxSize)
	}
	return nil
}

// Digest returns the whole image's sha256 (raw bytes).
func (r *Record) Digest() []byte { b, _ := parseSHA256(r.SHA256); return b }

func parseSHA256(s string) ([]byte, error) {
	const pre = "sha256:"
	if len(s) < len(pre) || s[:len(pre)] != pre {
		return nil, fmt.Errorf("digest %q: want sha256:<64 hex digits>", s)
	}
	b, err := hex.DecodeString(s[len(pre):])
	if err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("digest %q: want sha256:<64 hex digits>", s)
	}
	return b, nil
}

// Chunker hashes a stream into a Record's Size, SHA256 and Chunks as it is
// written to (io.Writer), so a disk is hashed while it is copied.
type Chunker struct {
	all, cur hashState
	n, inCur int64
	chunks   []string
}

type hashState = interface {
	io.Writer
	Sum([]byte) []byte
	Reset()
}

// NewChunker starts an empty digest.
func NewChunker() *Chunker { return &Chunker{all: sha256.New(), cur: sha256.New()} }

func (c *Chunker) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(int64(len(p)), ChunkSize-c.inCur)
		c.all.Write(p[:k])
		c.cur.Write(p[:k])
		c.inCur += k
		c.n += k
		p = p[k:]
		if c.inCur == ChunkSize {
			c.flush()
		}
	}
	return n, nil
}

func (c *Chunker) flush() {
	c.chunks = append(c.chunks, hex.EncodeToString(c.cur.Sum(nil)))
	c.cur.Reset()
	c.inCur = 0
}

// Fill sets r's Size, SHA256 and Chunks from what was written.
func (c *Chunker) Fill(r *Record) {
	if c.inCur > 0 {
		c.flush()
	}
	r.Size, r.SHA256, r.Chunks = c.n, digest.NewDigestFromBytes(digest.SHA256, c.all.Sum(nil)).String(), c.chunks
}

// ErrDamaged marks a mismatch against the record.
var ErrDamaged = errors.New("does not match the stick's record")

// zeroDigests are the digests of a whole and of the last, shorter, chunk
// of zeros: such a chunk is checked by comparing with zeros, not hashed. A
// disk is mostly zeros, and sha256 is slow where the stick boots without
// SHA instructions (emulated CPUs).
// The 4 MiB of zeros are made on first use, not at init: every node
// program (kiln serve at boot too) links this package.
var (
	zeroChunk      = sync.OnceValue(func() []byte { return make([]byte, ChunkSize) })
	zeroDigestOnce sync.Once
	zeroDigest     string
)

// matches says whether chunk i holds what the record says.
func (rec *Record) matches(i int, b []byte) bool {
	zeroDigestOnce.Do(func() { s := sha256.Sum256(zeroChunk()); zeroDigest = hex.EncodeToString(s[:]) })
	want := rec.Chunks[i]
	if (len(b) == ChunkSize && want == zeroDigest) || (len(b) < ChunkSize && want == zeroHex(len(b))) {
		return bytes.Equal(b, zeroChunk()[:len(b)])
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]) == want
}

func zeroHex(n int) string { s := sha256.Sum256(zeroChunk()[:n]); return hex.EncodeToString(s[:]) }

// Damaged is the error for chunk i not holding what the record says: it
// names the chunk's bytes and wraps ErrDamaged.
func (rec *Record) Damaged(i int) error {
	off := int64(i) * ChunkSize
	return fmt.Errorf("bytes %d–%d (chunk %d of %d) %w", off, off+min(ChunkSize, rec.Size-off), i+1, len(rec.Chunks), ErrDamaged)
}

// Verify reads the chunks from..to-1 of the image from r, checks each
// against the record and hands each to fn, in order. Every core reads and
// hashes chunks of its own ahead of fn, so reads are in flight while others
// hash (a device answers several reads at once faster than one after
// another) and fn, the writer, never waits for a hash. fn sees only chunks
// that match: the first damaged chunk (errors.Is ErrDamaged) or failed read
// stops Verify before fn sees it, and the error names its bytes. b is fn's
// until it returns.
func (rec *Record) Verify(ctx context.Context, r io.ReaderAt, from, to int, fn func(i int, b []byte) error) error {
	return rec.VerifyWith(ctx, r, from, to, rec.CheckChunk, fn)
}

// VerifyWith is Verify with another check of each chunk: check runs on the
// reading goroutines, several chunks at once and in any order, and returns
// nil or an error that names the chunk (Damaged). The read-back uses it to
// compare what it reads with the stick's bytes it wrote, which Verify had
// checked against the record, instead of hashing them again.
func (rec *Record) VerifyWith(ctx context.Context, r io.ReaderAt, from, to int, check, fn func(i int, b []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		b   []byte
		err error
	}
	workers := runtime.GOMAXPROCS(0)
	free := make(chan []byte, workers+1) // bounds the chunks in memory
	for range cap(free) {
		free <- chunkBuffers.Get().([]byte)
	}
	defer func() {
		for range cap(free) {
			chunkBuffers.Put(<-free)
		}
	}()
	pending := make(chan chan result, cap(free))
	go func() {
		defer close(pending)
		for i := from; i < to; i++ {
			var buf []byte
			select {
			case buf = <-free:
			case <-ctx.Done():
				return
			}
			if ctx.Err() != nil { // select picks at random when both are ready
				free <- buf
				return
			}
			c := make(chan result, 1)
			pending <- c // never blocks: as many slots as buffers
			go func() {
				off := int64(i) * ChunkSize
				b := buf[:min(ChunkSize, rec.Size-off)]
				n, err := r.ReadAt(b, off)
				switch {
				case n == len(b):
					err = check(i, b)
				case err == nil:
					err = io.ErrUnexpectedEOF
				}
				if err != nil && !errors.Is(err, ErrDamaged) {
					err = fmt.Errorf("bytes %d–%d: %w", off, off+int64(len(b)), err)
				}
				c <- result{b, err}
			}()
		}
	}()
	i := from
	var err error
	for c := range pending {
		res := <-c
		if err == nil {
			if err = res.err; err == nil {
				if err = ctx.Err(); err == nil {
					err = fn(i, res.b)
				}
			}
			if err != nil {
				cancel() // no more reads; drain those under way
			}
		}
		free <- res.b[:cap(res.b)]
		i++
	}
	if err == nil && i < to {
		err = ctx.Err()
	}
	return err
}

// chunkBuffers holds ChunkSize buffers aligned to 4 KiB, so that a reader
// may read into them with O_DIRECT (the target's read-back does).
var chunkBuffers = sync.Pool{New: func() any {
	const align = 4096
	b := make([]byte, ChunkSize+align)
	skip := (align - int(uintptr(unsafe.Pointer(&b[0]))%align)) % align
	return b[skip : skip+ChunkSize : skip+ChunkSize]
}}

// CheckChunk says whether b holds chunk i as the record has it; the error
// names the chunk's bytes (Damaged).
func (rec *Record) CheckChunk(i int, b []byte) error {
	if rec.matches(i, b) {
		return nil
	}
	return rec.Damaged(i)
}
