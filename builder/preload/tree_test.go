package preload

import (
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

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
	return "xattrs[" + strings.Join(xattrList(t, p), ",") + "]"
}

// xattrList lists p's xattrs as sorted name="value" strings.
func xattrList(t testing.TB, p string) []string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("list xattrs of %s: %v", p, err)
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var kv []string
	for _, name := range names {
		val := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			t.Fatalf("get xattr %s of %s: %v", name, p, err)
		}
		kv = append(kv, fmt.Sprintf("%s=%q", name, val[:m]))
	}
	return kv
}

func fileHash(t testing.TB, p string) string {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil))
}

// diffListings reports the lines only in a and only in b.
func diffListings(a, b []string) string {
	in := func(xs []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var d []string
	for _, x := range a {
		if !mb[x] {
			d = append(d, "- "+x)
		}
	}
	for _, x := range b {
		if !ma[x] {
			d = append(d, "+ "+x)
		}
	}
	return strings.Join(d, "\n")
}
