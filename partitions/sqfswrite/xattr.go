package sqfswrite

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// xattrPrefixes are the namespaces squashfs stores, by type number
// (squashfs_fs.h: SQUASHFS_XATTR_USER, _TRUSTED, _SECURITY).
var xattrPrefixes = []string{"user.", "trusted.", "security."}

// xattrSets collects the distinct xattr sets of a tree, each encoded as
// squashfs stores it: entries sorted by name, values in line.
type xattrSets struct {
	index map[string]uint32 // encoded set → its index
	sets  []xattrSet
	buf   []byte // listxattr/getxattr buffer, reused
}

type xattrSet struct {
	data  []byte // entries as stored in the xattr table
	count uint32
}

// read returns the index of the xattrs of the file at path (noXattr if it
// has none), adding the set if new.
func (x *xattrSets) read(path, rel string) (uint32, error) {
	names, err := x.list(path)
	if err != nil {
		return 0, fmt.Errorf("squashfs tree: xattrs of %s: %w", rel, err)
	}
	if len(names) == 0 {
		return noXattr, nil
	}
	sort.Strings(names)
	le := binary.LittleEndian
	var set []byte
	for _, name := range names {
		typ := -1
		for i, p := range xattrPrefixes {
			if strings.HasPrefix(name, p) && len(name) > len(p) {
				typ = i
				break
			}
		}
		if typ < 0 {
			return 0, fmt.Errorf("squashfs tree: %s has xattr %q; squashfs stores only user.*, trusted.* and security.* (remove it, e.g. an ACL: setfacl -b)", rel, name)
		}
		v, err := x.get(path, name)
		if err != nil {
			return 0, fmt.Errorf("squashfs tree: xattr %s of %s: %w", name, rel, err)
		}
		short := name[len(xattrPrefixes[typ]):]
		set = le.AppendUint16(set, uint16(typ))
		set = le.AppendUint16(set, uint16(len(short)))
		set = append(set, short...)
		set = le.AppendUint32(set, uint32(len(v)))
		set = append(set, v...)
	}
	if i, ok := x.index[string(set)]; ok {
		return i, nil
	}
	if x.index == nil {
		x.index = map[string]uint32{}
	}
	i := uint32(len(x.sets))
	x.index[string(set)] = i
	x.sets = append(x.sets, xattrSet{data: set, count: uint32(len(names))})
	return i, nil
}

// list names the xattrs of path (not following a symlink).
func (x *xattrSets) list(path string) ([]string, error) {
	for {
		if len(x.buf) < 4096 {
			x.buf = make([]byte, 4096)
		}
		n, err := unix.Llistxattr(path, x.buf)
		if errors.Is(err, unix.ERANGE) {
			x.buf = make([]byte, 2*len(x.buf))
			continue
		}
		if errors.Is(err, unix.ENOTSUP) { // a filesystem without xattrs
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range strings.Split(string(x.buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names, nil
	}
}

// get reads one xattr's value.
func (x *xattrSets) get(path, name string) ([]byte, error) {
	for {
		n, err := unix.Lgetxattr(path, name, x.buf)
		if errors.Is(err, unix.ERANGE) {
			x.buf = make([]byte, 2*len(x.buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		return append([]byte(nil), x.buf[:n]...), nil
	}
}

// xattrTables encodes the xattr table (the sets, in metadata blocks) that
// starts at byte at of the filesystem, and the xattr id table after it:
// the id blocks (one 16-byte entry per set: reference, count, size), the
// header naming the xattr table's start and the index of the id blocks.
// It returns both and where the header is (the superblock names it).
func (x *xattrSets) tables(at int64) (table, ids []byte, header int64) {
	le := binary.LittleEndian
	var t, idt metaTable
	for _, s := range x.sets {
		idt.data = le.AppendUint64(idt.data, ref(t.pos()))
		idt.data = le.AppendUint32(idt.data, s.count)
		idt.data = le.AppendUint32(idt.data, uint32(len(s.data)))
		t.data = append(t.data, s.data...)
	}
	table = t.bytes()
	idBlocks := at + int64(len(table))
	ids = idt.bytes()
	header = idBlocks + int64(len(ids))
	ids = le.AppendUint64(ids, uint64(at))
	ids = le.AppendUint32(ids, uint32(len(x.sets)))
	ids = le.AppendUint32(ids, 0)
	for b := int64(0); b < int64(len(idt.data)); b += metaSize {
		ids = le.AppendUint64(ids, uint64(idBlocks+int64(block(b))))
	}
	return table, ids, header
}
