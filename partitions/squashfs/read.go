package squashfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/squashfs"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// OpenImagePartition opens the image partition of a kiln disk as an fs.FS,
// read with go-diskfs's squashfs reader, so `kiln inspect` and `kiln verify`
// need neither root nor a loop device. (Only go-diskfs's squashfs *writer*
// is broken; its reader is checked against the kernel's in the tests.)
func OpenImagePartition(disk string) (fs.FS, io.Closer, error) {
	layout, err := gpt.Inspect(disk)
	if err != nil {
		return nil, nil, err
	}
	p, ok := layout.Find(contract.PartitionName)
	if !ok {
		return nil, nil, fmt.Errorf("%s has no %s partition (partitions: %s)", disk, contract.PartitionName, layout.Names())
	}
	if p.Filesystem != gpt.FSSquashfs {
		return nil, nil, fmt.Errorf("%s: partition %d (%s) holds no squashfs filesystem: damaged, or not built by kiln", disk, p.Number, contract.PartitionName)
	}
	f, err := gpt.OpenDisk(disk)
	if err != nil {
		return nil, nil, err
	}
	fsys, err := Read(f, p.Offset, p.Size, "image partition")
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: read image partition: %w", disk, err)
	}
	return fsys, f, nil
}

// Open opens the squashfs at offset in the file at path (size bytes at
// most) as an fs.FS (see Read): no root, no loop device.
func Open(path string, offset, size int64) (fs.FS, io.Closer, error) {
	f, err := gpt.OpenDisk(path)
	if err != nil {
		return nil, nil, err
	}
	fsys, err := Read(f, offset, size, path)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: read squashfs at byte %d: %w", path, offset, err)
	}
	return fsys, f, nil
}

// Read reads the squashfs at offset of f (size bytes at most) with
// go-diskfs's reader, guarded against its panics (it panics on some bit
// flips of its metadata): each becomes an error naming what (the image
// partition, a stick) and the file, so a damaged disk is a clear failure
// of inspect or verify, never a crash. The fuzz target FuzzDiskReaders
// checks this boundary with bit flips of real disks.
func Read(f *os.File, offset, size int64, what string) (_ fs.FS, err error) {
	var sq *squashfs.FileSystem
	func() {
		// Read itself walks the root inode, so a damaged root reference
		// panics before any guardedFS call.
		defer guard(&err, what, "/")
		sq, err = squashfs.Read(file.New(f, true), size, offset, 0)
	}()
	if err != nil {
		return nil, err
	}
	// The default 128 MB block cache only helps random access; verify reads
	// each 1 MiB block once, in order.
	sq.SetCacheSize(16 << 20)
	return guardedFS{sq, what}, nil
}

// guardedFS turns panics of go-diskfs's squashfs reader into errors.
type guardedFS struct {
	fsys fs.FS
	what string
}

func (g guardedFS) Open(name string) (f fs.File, err error) {
	defer guard(&err, g.what, name)
	if f, err = g.fsys.Open(name); err != nil {
		return nil, err
	}
	return guardedFile{f, g.what, name}, nil
}

func (g guardedFS) ReadDir(name string) (ents []fs.DirEntry, err error) {
	defer guard(&err, g.what, name)
	return fs.ReadDir(g.fsys, name)
}

func (g guardedFS) Stat(name string) (fi fs.FileInfo, err error) {
	defer guard(&err, g.what, name)
	return fs.Stat(g.fsys, name)
}

type guardedFile struct {
	f          fs.File
	what, name string
}

func (g guardedFile) Read(p []byte) (n int, err error) {
	defer guard(&err, g.what, g.name)
	return g.f.Read(p)
}

func (g guardedFile) Stat() (fi fs.FileInfo, err error) {
	defer guard(&err, g.what, g.name)
	return g.f.Stat()
}

func (g guardedFile) Close() (err error) {
	defer guard(&err, g.what, g.name)
	return g.f.Close()
}

func (g guardedFile) ReadDir(n int) (ents []fs.DirEntry, err error) {
	defer guard(&err, g.what, g.name)
	d, ok := g.f.(fs.ReadDirFile)
	if !ok {
		return nil, &fs.PathError{Op: "readdir", Path: g.name, Err: errors.New("not a directory")}
	}
	return d.ReadDir(n)
}

// guard is deferred by every guarded call.
func guard(err *error, what, name string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%s: %s: its squashfs metadata is damaged (the reader failed: %v)", what, name, r)
	}
}
