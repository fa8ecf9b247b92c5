package base

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/kiln-appliance/kiln/partitions/gpt"
)

// Disk is a disk image opened once for what is read of its partitions: its
// partition table, and each partition where a reader (mtools, a verity
// check) can find it. A raw file holds its partitions in place; a
// compressed base's are copied out, into TempDir, of one pass of its
// decompression that only moves forward, so a partition is decompressed
// once however often it is asked for.
type Disk struct {
	Path   string
	Layout *gpt.Layout
	// Raw says the file holds the disk's bytes as they are (see ReadLayout).
	Raw bool
	// TempDir is where a compressed disk's partitions are copied, in a
	// directory Close removes; "": $TMPDIR.
	TempDir string

	file   *os.File // a raw disk, opened on first use
	stream *Stream  // a compressed disk, at byte at
	at     int64
	dir    string
	copies map[int]string // partition number → its copy in dir
	opened []*os.File     // the copies Partitions opened
}

// OpenDisk opens the base image at path and reads its partition table; a
// compressed base's partitions are copied into tempDir ("": $TMPDIR) as
// they are asked for. The caller closes it.
func OpenDisk(path, tempDir string) (*Disk, error) {
	l, raw, err := ReadLayout(path)
	if err != nil {
		return nil, err
	}
	return &Disk{Path: path, Layout: l, Raw: raw, TempDir: tempDir}, nil
}

// InPlace is the disk at path whose table l the caller has read already,
// which holds its partitions in place: a kiln disk, a block device.
func InPlace(path string, l *gpt.Layout) *Disk {
	return &Disk{Path: path, Layout: l, Raw: true}
}

// PartitionFile is the file that holds partition p and where in it p starts:
// the disk itself when raw, else p's copy (copied, with those of also not
// copied yet, in one pass).
func (d *Disk) PartitionFile(p gpt.Partition, also ...gpt.Partition) (file string, offset int64, err error) {
	if d.Raw {
		return d.Path, p.Offset, nil
	}
	if err := d.copyOut(append([]gpt.Partition{p}, also...)); err != nil {
		return "", 0, err
	}
	return d.copies[p.Number], 0, nil
}

// Partitions opens readers of parts, in their order, read in one pass of a
// compressed disk's decompression; Close closes them.
func (d *Disk) Partitions(parts ...gpt.Partition) ([]io.ReaderAt, error) {
	var out []io.ReaderAt
	if d.Raw {
		if d.file == nil {
			f, err := os.Open(d.Path)
			if err != nil {
				return nil, err
			}
			d.file = f
		}
		for _, p := range parts {
			out = append(out, io.NewSectionReader(d.file, p.Offset, p.Size))
		}
		return out, nil
	}
	if err := d.copyOut(parts); err != nil {
		return nil, err
	}
	for _, p := range parts {
		f, err := os.Open(d.copies[p.Number])
		if err != nil {
			return nil, err
		}
		d.opened = append(d.opened, f)
		out = append(out, f)
	}
	return out, nil
}

// copyOut copies the partitions of parts not copied yet out of the
// compressed disk, in disk order, from where the stream is; one that lies
// behind it starts the stream again.
func (d *Disk) copyOut(parts []gpt.Partition) error {
	var todo []gpt.Partition
	for _, p := range parts {
		if _, ok := d.copies[p.Number]; !ok && !slices.ContainsFunc(todo, func(q gpt.Partition) bool { return q.Number == p.Number }) {
			todo = append(todo, p)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	slices.SortFunc(todo, func(a, b gpt.Partition) int { return cmp.Compare(a.Offset, b.Offset) })
	if d.dir == "" {
		dir, err := os.MkdirTemp(d.TempDir, "kiln-base-")
		if err != nil {
			return err
		}
		d.dir, d.copies = dir, map[int]string{}
	}
	if d.stream != nil && todo[0].Offset < d.at {
		d.stream.Close()
		d.stream = nil
	}
	if d.stream == nil {
		s, err := Open(d.Path, "")
		if err != nil {
			return err
		}
		d.stream, d.at = s, 0
	}
	for _, p := range todo {
		if _, err := io.CopyN(io.Discard, d.stream, p.Offset-d.at); err != nil {
			return fmt.Errorf("read the base: %w", err)
		}
		d.at = p.Offset
		name := filepath.Join(d.dir, fmt.Sprintf("part%d", p.Number))
		if err := copyPart(name, d.stream, p); err != nil {
			d.stream.Close()
			d.stream = nil // where it stopped is not known
			return err
		}
		d.at += p.Size
		d.copies[p.Number] = name
	}
	return nil
}

func copyPart(name string, r io.Reader, p gpt.Partition) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, r, p.Size); err != nil {
		f.Close()
		return fmt.Errorf("read partition %d %q of the base: %w", p.Number, p.Name, err)
	}
	return f.Close()
}

// Close closes what the disk opened and removes its copies.
func (d *Disk) Close() error {
	var errs []error
	for _, f := range d.opened {
		errs = append(errs, f.Close())
	}
	if d.file != nil {
		errs = append(errs, d.file.Close())
	}
	if d.stream != nil {
		errs = append(errs, d.stream.Close())
	}
	if d.dir != "" {
		errs = append(errs, os.RemoveAll(d.dir))
	}
	return errors.Join(errs...)
}
