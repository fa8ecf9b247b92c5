package partitions

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/partitions/verity"
)

// The image filesystem read back, as written: the files' digests
// (WithFileHashes).

// planHashFiles finds the files to hash in the written filesystem for the
// verity pass to feed; nil when that pass cannot (no verity, a compressed
// filesystem) or there is nothing to hash.
func (a *assembly) planHashFiles() (*verity.Files, error) {
	if len(a.o.hashFiles) == 0 || a.d.Image.NoVerity {
		return nil, nil
	}
	raw, err := squashfs.OpenRaw(io.NewSectionReader(a.out, a.place.start, a.fsSize))
	if errors.Is(err, squashfs.ErrNotRaw) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read back the image filesystem: %w", err)
	}
	files, err := verity.NewFiles(raw, a.o.hashFiles)
	if errors.Is(err, squashfs.ErrNotRaw) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read back the image filesystem: %w", err)
	}
	return files, nil
}

// hashThroughFilesystem hashes the files to hash through the image
// filesystem just written (compressed, or without verity: no verity pass
// to feed them).
func (a *assembly) hashThroughFilesystem(ctx context.Context) (err error) {
	open := func() (fs.FS, error) {
		raw, err := squashfs.OpenRaw(&offsetFile{a.out, a.place.start})
		if err == nil {
			return raw, nil
		}
		if !errors.Is(err, squashfs.ErrNotRaw) {
			return nil, fmt.Errorf("read back the image filesystem: %w", err)
		}
		fsys, err := squashfs.Read(a.out, a.place.start, a.fsSize, "image partition") // compressed: go-diskfs decompresses
		if err != nil {
			return nil, fmt.Errorf("read back the image filesystem: %w", err)
		}
		return fsys, nil
	}
	task := a.progress.Task(a.o.hashStep, 0)
	defer func() { task.Done(err) }()
	sums, err := squashfs.HashFiles(ctx, open, a.o.hashFiles, task)
	if err != nil {
		return fmt.Errorf("read back the image filesystem: %w", err)
	}
	return a.o.filesHashed(sums)
}
