package sqfswrite

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"
)

// node is one entry of the tree.
type node struct {
	name     string
	path     string // on the host
	rel      string // in the filesystem, slash-separated
	typ      uint16 // basic inode type (typeDir, typeReg, typeSymlink, ...)
	mode     uint16 // permission bits, setuid/setgid/sticky included
	uid, gid uint32
	xattr    uint32  // index of its xattr set, noXattr for none
	children []*node // sorted by name (byte order, as squashfs lookups need)
	subdirs  uint32
	size     int64
	offset   int64  // file: where its contents start
	target   string // symlink
	rdev     uint32 // device, as squashfs encodes it
	nlink    uint32 // names of a hard-linked inode in the tree (0: one)
	link     *node  // another name of this inode, which holds the inode
	ino      uint32 // inode number
	ref      uint64 // inode reference: metadata block << 16 | offset
}

// inode is the node that holds n's inode: n, or the first name of its
// hard link.
func (n *node) inode() *node {
	if n.link != nil {
		return n.link
	}
	return n
}

// maxName is the longest name a squashfs directory entry holds.
const maxName = 256

const noXattr = ^uint32(0)

// scanner reads a tree into nodes.
type scanner struct {
	cfg    *config
	links  map[[2]uint64]*node // first name of each hard-linked inode, by device and inode
	xattrs *xattrSets
}

// scan reads the tree under root.
func (s *scanner) scan(root string) (*node, error) {
	st, err := os.Lstat(root)
	if err != nil {
		return nil, fmt.Errorf("squashfs tree: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("squashfs tree %s is not a directory", root)
	}
	n := &node{path: root, typ: typeDir}
	if err := s.meta(n, st); err != nil {
		return nil, err
	}
	return n, s.scanDir(n)
}

func (s *scanner) scanDir(d *node) error {
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
		if err := check(c.rel, c.name, info.Mode(), s.cfg.asIs); err != nil {
			return err
		}
		if err := s.meta(c, info); err != nil {
			return err
		}
		if c.typ == typeDir {
			d.subdirs++
			if err := s.scanDir(c); err != nil {
				return err
			}
		}
		d.children = append(d.children, c)
	}
	// os.ReadDir sorts by name already; squashfs needs byte order, so say it.
	sort.Slice(d.children, func(i, j int) bool { return d.children[i].name < d.children[j].name })
	return nil
}

// meta fills in n's type, mode, size and, storing the tree as it is,
// owner, xattrs, link target, device and hard link.
func (s *scanner) meta(n *node, info fs.FileInfo) error {
	m := info.Mode()
	n.mode, n.xattr = modeBits(m), noXattr
	switch {
	case m.IsDir():
		n.typ = typeDir
	case m.IsRegular():
		n.typ, n.size = typeReg, info.Size()
	case m&fs.ModeSymlink != 0:
		n.typ = typeSymlink
	case m&fs.ModeCharDevice != 0:
		n.typ = typeChr
	case m&fs.ModeDevice != 0:
		n.typ = typeBlk
	case m&fs.ModeNamedPipe != 0:
		n.typ = typeFifo
	case m&fs.ModeSocket != 0:
		n.typ = typeSocket
	}
	if o, ok := s.cfg.overrides[n.rel]; ok && n.rel != "" {
		n.mode, n.uid, n.gid = modeBits(o.Mode), o.UID, o.GID
		delete(s.cfg.overrides, n.rel) // what is left names no file: an error
	} else if s.cfg.asIs {
		st := info.Sys().(*syscall.Stat_t)
		n.uid, n.gid = st.Uid, st.Gid
	}
	if !s.cfg.asIs {
		return nil
	}
	st := info.Sys().(*syscall.Stat_t)
	switch n.typ {
	case typeSymlink:
		t, err := os.Readlink(n.path)
		if err != nil {
			return fmt.Errorf("squashfs tree: %w", err)
		}
		if len(t) > maxTarget {
			return fmt.Errorf("squashfs tree: %s: a symlink target of %d bytes; at most %d", n.rel, len(t), maxTarget)
		}
		n.target = t
	case typeChr, typeBlk:
		n.rdev = encodeDev(unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	if n.typ != typeDir && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := s.links[key]; ok {
			n.link = first
			first.nlink++
			return nil // the inode, its owner and xattrs are the first name's
		}
		n.nlink = 1
		s.links[key] = n
	}
	x, err := s.xattrs.read(n.path, n.rel)
	if err != nil {
		return err
	}
	n.xattr = x
	return nil
}

// maxTarget is the longest symlink target Linux holds (PATH_MAX - 1).
const maxTarget = 4095

// encodeDev is the kernel's new_encode_dev, which squashfs stores.
func encodeDev(major, minor uint32) uint32 {
	return minor&0xff | major<<8 | (minor&^0xff)<<12
}

// check refuses what the writer does not store, naming it.
func check(rel, name string, mode fs.FileMode, asIs bool) error {
	if len(name) > maxName {
		return fmt.Errorf("squashfs tree: %s: a name of %d bytes; squashfs holds at most %d", rel, len(name), maxName)
	}
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("squashfs tree: %q is not a file name", rel)
	}
	if asIs || mode.IsDir() || mode.IsRegular() {
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
	return fmt.Errorf("squashfs tree: %s is %s; without AsIs kiln's squashfs writer stores only directories and regular files (copy the target in place of a symlink)", rel, kind)
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
