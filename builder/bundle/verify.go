package bundle

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// Report is what `kiln inspect` and `kiln verify` show of a bundle.
type Report struct {
	Path     string              `json:"path"`
	Format   string              `json:"format"`           // FormatImage or FormatFile
	Size     int64               `json:"size"`             // bytes of the stick image or file
	Layout   *gpt.Layout         `json:"layout,omitempty"` // stick images only
	Offset   int64               `json:"offset"`           // where the bundle's bytes start
	Header   int64               `json:"headerSize"`       // the filesystem starts at Offset+Header
	Manifest *bundlefmt.Manifest `json:"manifest"`
	// SignedBy lists the key IDs the envelope names (inspect: claimed, not
	// checked); Verified is the key whose signature verify checked.
	SignedBy []string `json:"signedBy"`
	Verified string   `json:"verified,omitempty"`

	envelope []byte
}

// locate finds where a bundle's bytes start in p.
func locate(p string) (format string, l *gpt.Layout, err error) {
	f, err := inputfile.Open(p)
	if err != nil {
		return "", nil, err
	}
	head := make([]byte, len(bundlefmt.Magic))
	_, err = f.ReadAt(head, 0)
	f.Close()
	if err == nil && string(head) == bundlefmt.Magic {
		return FormatFile, nil, nil
	}
	l, err = gpt.Inspect(p)
	if err != nil {
		return "", nil, err
	}
	if bundlePartition(l) == nil {
		return "", nil, bundlefmt.ErrNotBundle
	}
	return FormatImage, l, nil
}

func bundlePartition(l *gpt.Layout) *gpt.Partition {
	for i := range l.Partitions {
		if strings.EqualFold(l.Partitions[i].Type, bundlefmt.PartitionType) {
			return &l.Partitions[i]
		}
	}
	return nil
}

// Inspect reads a bundle's header and manifest, without checking the
// signature or the content.
func Inspect(p string) (*Report, error) {
	rep, err := readHeader(p)
	if err != nil {
		return nil, err
	}
	rep.Manifest, rep.SignedBy, err = bundlefmt.Unverified(rep.envelope)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return rep, nil
}

// readHeader finds the bundle in p and reads its header.
func readHeader(p string) (*Report, error) {
	format, l, err := locate(p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	rep := &Report{Path: p, Format: format, Layout: l}
	if l != nil {
		rep.Offset = bundlePartition(l).Offset
	}
	f, err := inputfile.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if rep.Size, err = f.Seek(0, io.SeekEnd); err != nil { // Stat says 0 for a stick
		return nil, err
	}
	h, err := bundlefmt.ReadHeader(io.NewSectionReader(f, rep.Offset, toEnd))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	rep.Header, rep.envelope = h.Size, h.Envelope
	return rep, nil
}

// toEnd is a section length that reaches the end of any file.
const toEnd = 1<<63 - 1

// Verify checks a bundle end to end with the given trusted keys: the
// signature, the manifest, the filesystem's digest, every file in it
// re-hashed, and every other byte (partition table, padding) being exactly
// what kiln writes. It names every problem it finds.
func Verify(ctx context.Context, p string, keys []ed25519.PublicKey, rp progress.Reporter) (*Report, error) {
	if rp == nil {
		rp = progress.Discard()
	}
	rep, err := readHeader(p)
	if err != nil {
		return nil, fmt.Errorf("failed verification: %w", err)
	}
	fail := func(what string, err error) (*Report, error) {
		return rep, fmt.Errorf("%s failed verification: %s: %w", p, what, err)
	}
	f, err := inputfile.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, _, id, err := bundlefmt.Open(io.NewSectionReader(f, rep.Offset, toEnd), keys)
	switch {
	case errors.Is(err, bundlefmt.ErrUntrusted):
		return fail("signature", err)
	case err != nil:
		return fail("manifest", err)
	}
	rep.Manifest, rep.Verified = m, id
	if err := checkFrame(f, rep); err != nil {
		return fail("layout", err)
	}
	task := rp.Task("verify "+p, 2*m.Filesystem.Size)
	fsErr := m.CheckFilesystem(f, rep.Offset+rep.Header, task)
	// Name the damaged files, not just "the filesystem": re-hash each one.
	var problems []error
	fsys, closer, err := squashfs.Open(p, rep.Offset+rep.Header, m.Filesystem.Size)
	if err != nil {
		problems = append(problems, fmt.Errorf("filesystem unreadable: %w", err))
	} else {
		defer closer.Close()
		problems = append(problems, checkFiles(ctx, fsys, m, task)...)
	}
	if fsErr != nil {
		problems = append(problems, fsErr)
	}
	if m.OS != nil && fsErr == nil {
		// The slot index describes the image, and the pack is what the
		// prior releases lack (the pack's chunks themselves the node checks as it
		// writes them; its bytes CheckFilesystem has hashed).
		if _, _, err := m.CheckOS(f, rep.Offset+rep.Header); err != nil {
			problems = append(problems, err)
		}
	}
	if len(problems) > 0 {
		err := errors.Join(problems...)
		task.Done(err)
		return fail(fmt.Sprintf("content (%d problem(s); the bundle is damaged or was modified: make or copy it again)", len(problems)), err)
	}
	task.Done(nil)
	return rep, nil
}

// checkFiles re-hashes every file the manifest lists through the filesystem
// (CheckFilesystem has hashed each at its byte range, where the node copies
// it from) and looks for files it does not list.
func checkFiles(ctx context.Context, fsys fs.FS, m *bundlefmt.Manifest, w io.Writer) []error {
	var problems []error
	listed := map[string]bool{}
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return append(problems, err)
		}
		listed[f.Path] = true
		if err := builder.VerifyFile(fsys, contract.File{Path: f.Path, Size: f.Size, Digest: f.Digest}, "the manifest", w); err != nil {
			problems = append(problems, err)
		}
	}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !listed[p] {
			problems = append(problems, fmt.Errorf("%s: not listed in the manifest", p))
		}
		return nil
	})
	if err != nil {
		problems = append(problems, fmt.Errorf("walk filesystem: %w", err))
	}
	sort.Slice(problems, func(i, j int) bool { return problems[i].Error() < problems[j].Error() })
	return problems
}

// checkFrame checks every byte outside the header and filesystem: a file
// is exactly header + filesystem; a stick image is exactly the partition
// table kiln writes for this envelope, and zeros.
func checkFrame(f *os.File, rep *Report) error {
	m := rep.Manifest
	content := rep.Header + m.Filesystem.Size
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if rep.Format == FormatFile {
		if size != content {
			return fmt.Errorf("file is %d bytes, header and filesystem are %d (truncated or appended to)", size, content)
		}
		return nil
	}
	want := gpt.StickSize(content)
	if size < want {
		return fmt.Errorf("stick image is %d bytes, its bundle needs %d: truncated", size, want)
	}
	// A stick may be larger than the image written to it: the backup GPT is
	// then not at its end, which gpt.Inspect already accepted.
	if size != want {
		return fmt.Errorf("stick image is %d bytes, kiln wrote %d (to check a stick itself, read back the first %d bytes)", size, want, want)
	}
	exp, err := os.CreateTemp("", "kiln-verify-")
	if err != nil {
		return err
	}
	defer os.Remove(exp.Name())
	defer exp.Close()
	if err := gpt.WriteStick(exp, content, bundlefmt.PartitionType, bundlefmt.PartitionName, guidSeed(rep.envelope)); err != nil {
		return err
	}
	start := rep.Offset
	partEnd := gpt.StickPartitionEnd(content)
	for _, region := range []struct {
		name     string
		from, to int64
	}{
		{"partition table", 0, start},
		{"padding after the filesystem", start + content, partEnd},
		{"backup partition table", partEnd, size},
	} {
		if err := sameBytes(f, exp, region.from, region.to); err != nil {
			return fmt.Errorf("%s: %w", region.name, err)
		}
	}
	return nil
}

// sameBytes compares [from, to) of a and b.
func sameBytes(a, b io.ReaderAt, from, to int64) error {
	const chunk = 1 << 20
	ba, bb := make([]byte, chunk), make([]byte, chunk)
	for off := from; off < to; off += chunk {
		n := min(chunk, to-off)
		if _, err := a.ReadAt(ba[:n], off); err != nil {
			return err
		}
		if _, err := b.ReadAt(bb[:n], off); err != nil {
			return err
		}
		if !bytes.Equal(ba[:n], bb[:n]) {
			for i := range n {
				if ba[i] != bb[i] {
					return fmt.Errorf("byte %d differs from what kiln writes", off+i)
				}
			}
		}
	}
	return nil
}
