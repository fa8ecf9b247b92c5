package partitions

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

	"github.com/kiln-appliance/kiln/internal/inputfile"
)

// Compression formats of a base image, detected from its first bytes.
const (
	BaseRaw  = "raw"
	BaseGzip = "gzip"
	BaseXz   = "xz"
	BaseZstd = "zstd"
)

var magics = []struct {
	format string
	magic  []byte
}{
	{BaseGzip, []byte{0x1f, 0x8b}},
	{BaseXz, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{BaseZstd, []byte{0x28, 0xb5, 0x2f, 0xfd}},
}

// Base is an open base disk image: Read returns the raw disk bytes,
// decompressed on the fly. When a digest was given, the read that reaches the
// end of the disk also checks the digest of the file's bytes (compressed, if
// compressed) and fails instead of returning io.EOF if it does not match.
type Base struct {
	Path   string
	Format string // BaseRaw, BaseGzip, BaseXz or BaseZstd

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

// OpenBase opens the base image at path. digest is "" or "sha256:<hex>".
// The format is detected from the magic bytes, never from the file name, so a
// mis-named file still works.
func OpenBase(path, digest string) (*Base, error) {
	want, err := parseDigest(digest)
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", path, err)
	}
	f, err := inputfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open base image: %w", err)
	}
	b := &Base{Path: path, Format: BaseRaw, file: f, hash: sha256.New(), want: want, closer: func() {}}
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
	case BaseRaw:
		b.r = br
	case BaseGzip:
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, b.corrupt(err)
		}
		b.r, b.closer = zr, func() { zr.Close() }
	case BaseXz:
		// xz-utils decodes 2x (real data) to 10x (sparse disks) faster than
		// ulikunitz/xz; see docs/FILESYSTEM.md.
		if err := b.startXz(br); err != nil {
			f.Close()
			return nil, err
		}
	case BaseZstd:
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

func (b *Base) corrupt(err error) error {
	return fmt.Errorf("base image %s (%s) is corrupt or truncated: %w; re-download or re-copy it", b.Path, b.Format, err)
}

// startXz decodes with `xz -dc`, fed from r.
func (b *Base) startXz(r io.Reader) error {
	cmd := exec.Command("xz", "-dc")
	cmd.Stdin = r
	cmd.Stderr = &b.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("decompress base image %s: %w (install xz-utils)", b.Path, err)
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
func (b *Base) Read(p []byte) (int, error) {
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
		if errors.Is(err, io.ErrUnexpectedEOF) || b.Format != BaseRaw {
			return n, b.corrupt(err)
		}
		return n, fmt.Errorf("read base image %s: %w", b.Path, err)
	}
	return n, err
}

// finish hashes what the decompressor left unread (trailing bytes) and checks
// the digest.
func (b *Base) finish() error {
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
func (b *Base) Close() error {
	b.closer()
	return b.file.Close()
}
