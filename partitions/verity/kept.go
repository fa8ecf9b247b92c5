package verity

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kiln-appliance/kiln/partitions/squashfs"
)

// KeptTrees keeps the dm-verity trees of image filesystems in a directory,
// so a rebuild of the same filesystem copies its tree instead of hashing
// every byte again (a warm rebuild's largest step after the write).
//
// A tree is named by TreeKey: the salt, the filesystem's size, and every
// byte of the filesystem, read now, except the stored bytes of the files the
// caller vouches for (blobs, by their locked digest), which are named by
// size and digest. So the tree is used only for bytes it was computed from,
// as far as the caller's digests hold — the same trust the build puts in a
// cached blob it does not hash again.
//
// A build only stages a new tree (Stage); Commit keeps it once the caller
// has finished checking the bytes its digests vouch for (a blob read in
// place is checked after the disk is written), and Discard drops it on
// failure, so a tree of bytes that turned out not to match their digests is
// never kept.
type KeptTrees struct {
	Dir string
	// StageDir is where a new tree waits for Commit (default Dir): a build
	// gives its work directory, on Dir's filesystem, so the staged tree of
	// a build that is killed goes with that directory (which the next
	// build removes).
	StageDir string

	pending, key string // a staged tree (temp file) and its name
}

// keptTrees is how many trees a directory keeps (the most recently used);
// a 1 GiB filesystem's tree is 8 MiB.
const keptTrees = 8

const keptTempPrefix = ".staging-"

// KeptTreeStep is the progress step of a build that copies a kept tree.
const KeptTreeStep = "verity tree kept from an earlier build"

// Commit keeps the tree staged last, if any, and drops the
// least recently used beyond keptTrees. A tree that cannot be kept costs
// the next build its hashing, nothing more: the error is for the log.
func (t *KeptTrees) Commit() error {
	if t == nil || t.pending == "" {
		return nil
	}
	pending := t.pending
	t.pending = ""
	// The file was synced before; the rename is not: a power cut may lose
	// it, which costs the next build its hashing, never a torn tree.
	if err := os.Rename(pending, filepath.Join(t.Dir, t.key)); err != nil {
		os.Remove(pending)
		return fmt.Errorf("keep verity tree: %w", err)
	}
	t.prune()
	return nil
}

// Discard drops a staged tree (a no-op after Commit).
func (t *KeptTrees) Discard() {
	if t != nil && t.pending != "" {
		os.Remove(t.pending)
		t.pending = ""
	}
}

// Any says whether a tree is kept (a build that hashes nothing else will
// likely copy one).
func (t *KeptTrees) Any() bool {
	if t == nil {
		return false
	}
	ents, _ := os.ReadDir(t.Dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), keptTempPrefix) {
			return true
		}
	}
	return false
}

func (t *KeptTrees) prune() {
	ents, err := os.ReadDir(t.Dir)
	if err != nil {
		return
	}
	type kept struct {
		name string
		used time.Time
	}
	var trees []kept
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if strings.HasPrefix(e.Name(), keptTempPrefix) { // a killed build's
			if time.Since(fi.ModTime()) > time.Hour {
				os.Remove(filepath.Join(t.Dir, e.Name()))
			}
			continue
		}
		trees = append(trees, kept{e.Name(), fi.ModTime()})
	}
	sort.Slice(trees, func(i, j int) bool { return trees[i].used.After(trees[j].used) })
	for i := keptTrees; i < len(trees); i++ {
		os.Remove(filepath.Join(t.Dir, trees[i].name))
	}
}

// load copies the tree kept under key into out at tree (the hash area's
// first block after the superblock), streaming it through the sha256 it was
// stored with. It reports false when there is none or it does not check
// out (out's tree area is then to be written anew).
func (t *KeptTrees) load(key string, out io.WriterAt, tree, size int64) bool {
	p := filepath.Join(t.Dir, key)
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() != size+sha256.Size {
		return false
	}
	h := sha256.New()
	if _, err := io.Copy(io.NewOffsetWriter(out, tree), io.TeeReader(io.LimitReader(f, size), h)); err != nil {
		return false
	}
	sum := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, sum); err != nil || !bytes.Equal(sum, h.Sum(nil)) {
		os.Remove(p) // damaged: the tree is hashed anew and kept again
		return false
	}
	now := time.Now()
	os.Chtimes(p, now, now) // recently used: kept longest
	return true
}

// Stage keeps tr's tree, just written, under key once Commit is called: a
// temp file beside the kept ones, the tree's bytes with their sha256 after
// them. A tree that cannot be staged is hashed next time: the error is for
// the log.
func (t *KeptTrees) Stage(key string, tr Tree) error {
	tree := tr.HashOffset + Block
	return t.stage(key, tr.Out, tree, TreeSize(tr.DataBlocks)-Block)
}

func (t *KeptTrees) stage(key string, src io.ReaderAt, tree, size int64) (err error) {
	if err := os.MkdirAll(t.Dir, 0o755); err != nil {
		return err
	}
	dir := t.StageDir
	if dir == "" {
		dir = t.Dir
	}
	f, err := os.CreateTemp(dir, keptTempPrefix+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), io.NewSectionReader(src, tree, size)); err != nil {
		return err
	}
	if _, err := f.Write(h.Sum(nil)); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	t.Discard() // an earlier build's, never committed
	t.pending, t.key = f.Name(), key
	return nil
}

// keyReadsAtMost is what treeKey reads of a filesystem whatever its size
// (beyond it, at most a quarter of it): the agent and the tables are tens
// of MiB.
const keyReadsAtMost = 64 << 20

// ErrNotKeyable says a filesystem's tree is hashed every time: it cannot be
// read raw, a known file is missing or not where its digest can name it, or
// too much of it is not known files.
var ErrNotKeyable = errors.New("no kept verity tree for this filesystem")

// TreeKey names tr's tree by the filesystem it is over (tr.HashOffset
// bytes of tr.Data) and its salt, known naming files by their size and
// digest (see treeKey); ErrNotKeyable (wrapped) when the filesystem's tree
// is to be hashed every time.
func TreeKey(tr Tree, known map[string]squashfs.FileDigest) (string, error) {
	return treeKey(tr.Data, tr.HashOffset, tr.Salt, known)
}

// treeKey names the verity tree of the filesystem part (fsSize bytes):
// one sha256 over the salt, the size, and the filesystem front to back —
// each stored run of a known file as its offset, size and digest, every
// other byte (superblock, tables, directories, padding, every file not
// known) as itself. A known file counts only if it is stored in one
// uncompressed run of exactly its size; otherwise its bytes are read like
// the rest.
func treeKey(part io.ReaderAt, fsSize int64, salt []byte, known map[string]squashfs.FileDigest) (string, error) {
	raw, err := squashfs.OpenRaw(io.NewSectionReader(part, 0, fsSize))
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotKeyable, err)
	}
	paths := make([]string, 0, len(known))
	for p := range known {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	files, err := raw.Files(paths) // sorted by where they start
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotKeyable, err)
	}
	type run struct {
		off, n int64
		digest string
	}
	var runs []run
	var pos, read int64
	for _, f := range files {
		d := known[f.Path]
		if f.Size == 0 || d.Size != f.Size || len(f.Extents) != 1 || f.Extents[0].Sparse || f.Extents[0].N != f.Size {
			continue // not one run of its bytes: read with the rest
		}
		e := f.Extents[0]
		if e.Off < pos {
			return "", fmt.Errorf("%w: %s shares its bytes with another known file", ErrNotKeyable, f.Path)
		}
		runs = append(runs, run{e.Off, e.N, d.Digest})
		read += e.Off - pos
		pos = e.Off + e.N
	}
	// A key that reads most of the filesystem costs what hashing the tree
	// does (a large preloaded store, say), and a cold build would pay both.
	if read += fsSize - pos; read > max(keyReadsAtMost, fsSize/4) {
		return "", fmt.Errorf("%w: %d of its %d bytes are not known files", ErrNotKeyable, read, fsSize)
	}

	h := sha256.New()
	word := func(v int64) { h.Write(binary.BigEndian.AppendUint64(nil, uint64(v))) }
	h.Write([]byte("kiln kept verity tree 1\x00"))
	word(int64(len(salt)))
	h.Write(salt)
	word(fsSize)
	buf := make([]byte, 1<<20)
	bytesOf := func(from, to int64) error { // every byte of [from, to), as itself
		h.Write([]byte{'B'})
		word(from)
		word(to - from)
		for from < to {
			n := min(int64(len(buf)), to-from)
			if _, err := part.ReadAt(buf[:n], from); err != nil {
				return fmt.Errorf("read the image filesystem: %w", err)
			}
			h.Write(buf[:n])
			from += n
		}
		return nil
	}
	pos = 0
	for _, r := range runs {
		if err := bytesOf(pos, r.off); err != nil {
			return "", err
		}
		h.Write([]byte{'F'})
		word(r.off)
		word(r.n)
		word(int64(len(r.digest)))
		h.Write([]byte(r.digest))
		pos = r.off + r.n
	}
	if err := bytesOf(pos, fsSize); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Copy writes tr's superblock and the tree kept under key, reporting false
// when there is none to use (tr's hash area is then to be written anew).
func (t *KeptTrees) Copy(key string, tr Tree) (*Verity, bool) {
	if tr.DataBlocks < 2 {
		return nil, false
	}
	tree := tr.HashOffset + Block
	if _, err := tr.Out.WriteAt(superblock(tr.DataBlocks, tr.Salt, tr.UUID), tr.HashOffset); err != nil {
		return nil, false
	}
	if !t.load(key, tr.Out, tree, TreeSize(tr.DataBlocks)-Block) {
		return nil, false
	}
	v, err := tr.root(tree)
	return v, err == nil
}
