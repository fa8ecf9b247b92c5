// Package treecmp describes a directory tree the way a filesystem writer
// must keep it — type, mode, owner, size, contents, link count, link
// target, device number, xattrs — so tests compare a staged tree with what
// the kernel (or another reader) shows of the filesystem written from it.
package treecmp

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Describe maps each path under root (relative; "." for root) to a line
// describing it. Times are left out: writers set their own.
func Describe(t testing.TB, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := info.Sys().(*syscall.Stat_t)
		d := fmt.Sprintf("mode=%o uid=%d gid=%d", st.Mode, st.Uid, st.Gid)
		switch {
		case info.Mode().IsRegular():
			d += fmt.Sprintf(" size=%d nlink=%d sha=%s", st.Size, st.Nlink, SHA256File(t, p))
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			d += fmt.Sprintf(" nlink=%d -> %s", st.Nlink, target)
		case info.Mode()&os.ModeDevice != 0:
			d += fmt.Sprintf(" nlink=%d dev=%d:%d", st.Nlink, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		default: // directory, FIFO, socket
			d += fmt.Sprintf(" nlink=%d", st.Nlink)
		}
		if rel != "." {
			d += " xattrs=" + Xattrs(t, p)
		}
		m[rel] = d
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Compare reports every entry of want that got lacks or describes
// otherwise, and any extra entry of got.
func Compare(t testing.TB, want, got string) {
	t.Helper()
	w, g := Describe(t, want), Describe(t, got)
	for p, d := range w {
		if g[p] != d {
			t.Errorf("%s:\n staged  %s\n written %s", p, d, g[p])
		}
	}
	for p, d := range g {
		if _, ok := w[p]; !ok {
			t.Errorf("%s: written (%s), not staged", p, d)
		}
	}
}

// Xattrs lists the xattrs of p (not following a symlink), sorted, with
// their values in hex.
func Xattrs(t testing.TB, p string) string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var s []string
	for _, name := range names {
		v := make([]byte, 64<<10)
		vn, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, name, err)
		}
		s = append(s, fmt.Sprintf("%s=%x", name, v[:vn]))
	}
	return strings.Join(s, ",")
}

// SHA256File is the hex sha256 of the file at p.
func SHA256File(t testing.TB, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// OverlayLayer mounts an overlay with lower, a written image layer, as
// its upper lower layer (as containers/storage does) and checks its char
// 0:0 "whiteout" hides the file below, its opaque "etc" hides the
// directory below, etc/passwd reads through and a write lands in upper.
func OverlayLayer(t testing.TB, lower string) {
	t.Helper()
	d := t.TempDir()
	upper, work, merged := filepath.Join(d, "u"), filepath.Join(d, "w"), filepath.Join(d, "m")
	for _, p := range []string{upper, work, merged} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A bottom layer under the written one: its etc/hidden must not show
	// through the opaque etc, nor its whiteout through the whiteout.
	bottom := filepath.Join(d, "bottom")
	for _, f := range []string{"etc/hidden", "whiteout"} {
		os.MkdirAll(filepath.Dir(filepath.Join(bottom, f)), 0o755)
		if err := os.WriteFile(filepath.Join(bottom, f), []byte("below"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opt := fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", lower, bottom, upper, work)
	if out, err := exec.Command("mount", "-t", "overlay", "overlay", "-o", opt, merged).CombinedOutput(); err != nil {
		t.Fatalf("overlay mount: %v\n%s", err, out)
	}
	defer func() {
		if out, err := exec.Command("umount", merged).CombinedOutput(); err != nil {
			t.Errorf("umount overlay: %v\n%s", err, out)
		}
	}()
	if _, err := os.Lstat(filepath.Join(merged, "whiteout")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("whiteout (char 0:0) does not hide the lower file: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(merged, "etc/hidden")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("opaque etc shows the lower etc/hidden: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(merged, "etc/passwd")); err != nil || !bytes.HasPrefix(b, []byte("root:")) {
		t.Errorf("read through the overlay: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(merged, "etc/new"), []byte("x"), 0o644); err != nil {
		t.Errorf("write through overlay: %v", err)
	}
}
