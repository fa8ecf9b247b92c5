package preload

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"golang.org/x/sys/unix"
)

// treeListing describes every entry under root, one line each: path, type
// and mode, owner, size or device, mtime, xattrs, content hash or link
// target, and for hard links the first path of the inode. Two trees are
// byte-identical where it matters for a filesystem image when their
// listings are equal.
func treeListing(t testing.TB, root string) []string {
	t.Helper()
	type ino struct{ dev, ino uint64 }
	first := map[ino]string{}
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", rel, info.Mode(), st.Uid, st.Gid)
		if !d.IsDir() {
			line += fmt.Sprintf(" size=%d", st.Size)
			if st.Nlink > 1 {
				k := ino{uint64(st.Dev), st.Ino}
				if f, ok := first[k]; ok {
					line += " hardlink=" + f
				} else {
					first[k] = rel
				}
			}
		}
		if info.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0 {
			line += fmt.Sprintf(" rdev=%d:%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
		}
		line += fmt.Sprintf(" mtime=%d.%09d", st.Mtim.Sec, st.Mtim.Nsec)
		line += " " + xattrs(t, p)
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		case info.Mode().IsRegular():
			line += " " + fileHash(t, p)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func xattrs(t testing.TB, p string) string {
	kv, err := layers.Xattrs(p)
	if err != nil {
		t.Fatal(err)
	}
	return "xattrs[" + strings.Join(kv, ",") + "]"
}

func fileHash(t testing.TB, p string) string {
	h, err := layers.FileHash(p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// diffListings reports the lines only in a and only in b.
func diffListings(a, b []string) string { return layers.Diff(a, b) }
