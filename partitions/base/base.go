// Package base reads the base disk image a kiln disk is built from (a
// vendor's raw CoreOS-like disk, or its gzip, xz or zstd download): its
// bytes decompressed on the fly, the file's digest checked as the last byte
// is read, a raw file's holes answered without reading them, and its
// partition table.
package base

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/kiln-appliance/kiln/internal/hosttools"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/partitions/gpt"
)

// Compression formats of a base image, detected from its first bytes.
const (
	Raw  = "raw"
	Gzip = "gzip"
	Xz   = "xz"
	Zstd = "zstd"
)

var magics = []struct {
	format string
	magic  []byte
}{
	{Gzip, []byte{0x1f, 0x8b}},
	{Xz, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd}},
}

// Stream is an open base disk image read front to back: Read returns the
// raw disk bytes, decompressed on the fly. When a digest was given, the read
// that reaches the end of the disk also checks the digest of the file's
// bytes (compressed, if compressed) and fails instead of returning io.EOF if
// it does not match. Disk is the base opened for its partitions.
type Stream struct {
	Path   string
	Format string // Raw, Gzip, Xz or Zstd

	file   *os.File
	hashed io.Reader // the file's bytes, through the hash
	r      io.Reader // the raw disk bytes
	closer func()
	hash   hash.Hash
	want   string // hex sha256, "" when not checked
	done   bool

	cmd    *exec.Cmd // xz, when decoding xz
	stderr bytes.Buffer
}

// Open opens the base image at path. digest is "" or "sha256:<hex>".
// The format is detected from the magic bytes, never from the file name, so a
// mis-named file still works.
func Open(path, digest string) (*Stream, error) {
	want, err := parseDigest(digest)
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", path, err)
	}
	f, err := inputfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open base image: %w", err)
	}
	b := &Stream{Path: path, Format: Raw, file: f, hash: sha256.New(), want: want, closer: func() {}}
	holes, err := newHoleReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open base image: %w", err)
	}
	var src io.Reader = holes
	if want != "" {
		src = io.TeeReader(f, b.hash)
	}
	br := bufio.NewReaderSize(src, 1<<20)
	b.hashed = br
	head, _ := br.Peek(8) // short files are caught below, as a bad disk
	for _, m := range magics {
		if bytes.HasPrefix(head, m.magic) {
			b.Format = m.format
		}
	}
	switch b.Format {
	case Raw:
		b.r = br
	case Gzip:
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, b.corrupt(err)
		}
		b.r, b.closer = zr, func() { zr.Close() }
	case Xz:
		// xz-utils decodes 2x (real data) to 10x (sparse disks) faster than
		// ulikunitz/xz; see docs/FILESYSTEM.md.
		if err := b.startXz(br); err != nil {
			f.Close()
			return nil, err
		}
	case Zstd:
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(1<<31))
		if err != nil {
			f.Close()
			return nil, b.corrupt(err)
		}
		b.r, b.closer = zr, zr.Close
	}
	return b, nil
}

func parseDigest(d string) (string, error) {
	if d == "" {
		return "", nil
	}
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexPart) != 64 {
		return "", fmt.Errorf("digest %q is not of the form sha256:<64 hex digits>", d)
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", fmt.Errorf("digest %q is not of the form sha256:<64 hex digits>", d)
	}
	return strings.ToLower(hexPart), nil
}

func (b *Stream) corrupt(err error) error {
	return fmt.Errorf("base image %s (%s) is corrupt or truncated: %w; re-download or re-copy it", b.Path, b.Format, err)
}

// startXz decodes with `xz -dc`, fed from r.
func (b *Stream) startXz(r io.Reader) error {
	cmd := exec.Command("xz", "-dc")
	cmd.Stdin = r
	cmd.Stderr = &b.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return hosttools.RunError("decompress base image "+b.Path, err, nil)
	}
	b.cmd, b.r = cmd, out
	b.closer = func() {
		if !b.done {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}
	return nil
}

// Read reads raw disk bytes.
func (b *Stream) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		if b.cmd != nil {
			if werr := b.cmd.Wait(); werr != nil {
				return n, b.corrupt(fmt.Errorf("%w: %s", werr, bytes.TrimSpace(b.stderr.Bytes())))
			}
		}
		if cerr := b.finish(); cerr != nil {
			return n, cerr
		}
	} else if err != nil && err != io.EOF {
		if errors.Is(err, io.ErrUnexpectedEOF) || b.Format != Raw {
			return n, b.corrupt(err)
		}
		return n, fmt.Errorf("read base image %s: %w", b.Path, err)
	}
	return n, err
}

// finish hashes what the decompressor left unread (trailing bytes) and checks
// the digest.
func (b *Stream) finish() error {
	if _, err := io.Copy(io.Discard, b.hashed); err != nil {
		return fmt.Errorf("read base image %s: %w", b.Path, err)
	}
	if b.want == "" {
		return nil
	}
	got := hex.EncodeToString(b.hash.Sum(nil))
	if got != b.want {
		return fmt.Errorf("base image %s has digest sha256:%s, but the recipe expects sha256:%s; use the right file or fix base.digest", b.Path, got, b.want)
	}
	return nil
}

// Close releases the file.
func (b *Stream) Close() error {
	b.closer()
	return b.file.Close()
}

// ReadLayout reads the partition table of the base image at path from its
// first MiB. raw says the file holds the disk's bytes as they are
// (uncompressed), so a partition can be read in place at its offset, and
// its filesystems and labels were detected too; a compressed base's first
// MiB holds only the table, and its partitions must be decompressed to be
// read.
func ReadLayout(path string) (l *gpt.Layout, raw bool, err error) {
	b, err := Open(path, "")
	if err != nil {
		return nil, false, err
	}
	defer b.Close()
	var r io.ReaderAt = b.file
	if b.Format != Raw {
		head := make([]byte, 1<<20)
		n, err := io.ReadFull(b, head)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, false, err
		}
		r = bytes.NewReader(head[:n])
	}
	l, err = gpt.Read(r, "base image "+path)
	if err != nil {
		return nil, false, err
	}
	if len(l.Partitions) == 0 {
		return nil, false, fmt.Errorf("base image %s has an empty partition table", path)
	}
	return l, b.Format == Raw, nil
}
