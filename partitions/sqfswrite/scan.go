package sqfswrite

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
)

// node is a directory or regular file of the tree.
type node struct {
	name     string
	path     string // on the host
	rel      string // in the filesystem, slash-separated
	mode     uint16 // permission bits, setuid/setgid/sticky included
	dir      bool
	children []*node // sorted by name (byte order, as squashfs lookups need)
	subdirs  uint32
	size     int64
	offset   int64  // file: where its contents start
	ino      uint32 // inode number
	ref      uint64 // inode reference: metadata block << 16 | offset
}

// maxName is the longest name a squashfs directory entry holds.
const maxName = 256

// scan reads the tree under root.
func scan(root string) (*node, error) {
	st, err := os.Lstat(root)
	if err != nil {
		return nil, fmt.Errorf("squashfs tree: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("squashfs tree %s is not a directory", root)
	}
	n := &node{path: root, dir: true, mode: modeBits(st.Mode())}
	return n, scanDir(n)
}

func scanDir(d *node) error {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("squashfs tree: %w", err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			return fmt.Errorf("squashfs tree: %w", err)
		}
		c := &node{name: e.Name(), path: filepath.Join(d.path, e.Name()), rel: path.Join(d.rel, e.Name())}
		if err := check(c.rel, c.name, info.Mode()); err != nil {
			return err
		}
		c.mode = modeBits(info.Mode())
		if info.IsDir() {
			c.dir = true
			d.subdirs++
			if err := scanDir(c); err != nil {
				return err
			}
		} else {
			c.size = info.Size()
		}
		d.children = append(d.children, c)
	}
	// os.ReadDir sorts by name already; squashfs needs byte order, so say it.
	sort.Slice(d.children, func(i, j int) bool { return d.children[i].name < d.children[j].name })
	return nil
}

// check refuses what the writer does not store, naming it.
func check(rel, name string, mode fs.FileMode) error {
	if len(name) > maxName {
		return fmt.Errorf("squashfs tree: %s: a name of %d bytes; squashfs holds at most %d", rel, len(name), maxName)
	}
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("squashfs tree: %q is not a file name", rel)
	}
	if mode.IsDir() || mode.IsRegular() {
		return nil
	}
	kind := "a special file"
	switch {
	case mode&fs.ModeSymlink != 0:
		kind = "a symlink"
	case mode&fs.ModeDevice != 0:
		kind = "a device"
	case mode&fs.ModeNamedPipe != 0:
		kind = "a FIFO"
	case mode&fs.ModeSocket != 0:
		kind = "a socket"
	}
	return fmt.Errorf("squashfs tree: %s is %s; kiln's squashfs writer stores only directories and regular files (copy the target in place of a symlink)", rel, kind)
}

// modeBits is the mode squashfs stores besides the type: permissions and
// setuid, setgid, sticky.
func modeBits(m fs.FileMode) uint16 {
	b := uint16(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}
