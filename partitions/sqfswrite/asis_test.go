package sqfswrite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/test/treecmp"
)

// A bundle's filesystem is the same bytes as before AsIs existed (sha256
// of the stageTree image written by the bundle-only writer): bundles stay
// reproducible across kiln versions.
func TestBundleBytesUnchanged(t *testing.T) {
	img, _ := writeImage(t, stageTree(t), 0)
	const want = "89a64fe4a1450e9c1dff117305f6b622a031825c152f5bc0b215b603e69cda7a"
	if got := hashFile(t, img); got != want {
		t.Fatalf("bundle filesystem sha256 %s, want %s", got, want)
	}
}

// stageGeneral writes a tree with all containers/storage holds: an overlay
// layer's whiteout (char 0:0) and opaque dir, symlinks, devices, a FIFO, a
// socket, hard links across directories, setuid/setgid/sticky bits, other
// owners and xattrs of every namespace squashfs stores (some sets shared,
// one value of 2 KiB, a set bigger than a metadata block).
func stageGeneral(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "tree")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	diff := filepath.Join(root, "storage/overlay/l1/diff")
	must(os.MkdirAll(filepath.Join(diff, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(diff, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "oci/blobs/sha256"), 0o755))
	must(os.WriteFile(filepath.Join(root, "oci/blobs/sha256/big"), bytes.Repeat([]byte("kiln"), 700_000), 0o644))
	must(os.WriteFile(filepath.Join(diff, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	must(os.Link(filepath.Join(diff, "etc/passwd"), filepath.Join(diff, "etc/passwd-")))
	must(os.Link(filepath.Join(diff, "etc/passwd"), filepath.Join(diff, "usr/passwd-elsewhere")))
	must(os.WriteFile(filepath.Join(diff, "usr/bin/busybox"), bytes.Repeat([]byte{0x7f}, 5000), 0o755))
	for _, n := range []string{"sh", "ls", "cat"} { // a hard-linked multi-call binary
		must(os.Link(filepath.Join(diff, "usr/bin/busybox"), filepath.Join(diff, "usr/bin", n)))
	}
	must(os.Symlink("../etc/passwd", filepath.Join(diff, "usr/link")))
	must(os.Symlink(strings.Repeat("long/", 200)+"target", filepath.Join(diff, "usr/long-link")))
	must(os.Symlink("dangling", filepath.Join(diff, "dangling")))
	must(unix.Mknod(filepath.Join(diff, "whiteout"), unix.S_IFCHR, 0))
	must(unix.Mknod(filepath.Join(diff, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(filepath.Join(diff, "loop300"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 300)))) // minor > 255
	must(unix.Mknod(filepath.Join(diff, "bigmajor"), unix.S_IFCHR|0o600, int(unix.Mkdev(511, 70000))))
	must(unix.Mkfifo(filepath.Join(diff, "fifo"), 0o640))
	must(unix.Mknod(filepath.Join(diff, "socket"), unix.S_IFSOCK|0o755, 0))
	must(os.WriteFile(filepath.Join(diff, "ping"), []byte("#!/bin/sh\n"), 0o755))
	capv2 := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	must(unix.Setxattr(filepath.Join(diff, "etc"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(filepath.Join(diff, "etc/passwd"), "user.kiln", []byte("x"), 0))
	must(unix.Setxattr(filepath.Join(diff, "usr/bin/busybox"), "user.kiln", []byte("x"), 0)) // the same set as passwd
	must(unix.Setxattr(filepath.Join(diff, "usr/bin/busybox"), "user.big", bytes.Repeat([]byte{1, 2}, 1024), 0))
	must(unix.Setxattr(filepath.Join(diff, "usr"), "user.empty", nil, 0))
	must(unix.Lsetxattr(filepath.Join(diff, "usr/link"), "trusted.overlay.redirect", []byte("/x"), 0))
	must(unix.Setxattr(filepath.Join(diff, "fifo"), "trusted.fifo", []byte("f"), 0))
	must(unix.Setxattr(filepath.Join(diff, "null"), "security.dev", []byte("d"), 0))
	for i := range 12 { // a set of 3 KiB (ext4 holds 4 KiB per inode)
		must(unix.Setxattr(filepath.Join(root, "oci"), fmt.Sprintf("user.a%02d", i), bytes.Repeat([]byte{byte(i)}, 250), 0))
	}
	for i := range 600 { // sets enough for two xattr id blocks, entries across metadata blocks, files for several inode blocks
		p := filepath.Join(root, "many", fmt.Sprintf("f%03d", i))
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		must(os.WriteFile(p, []byte(fmt.Sprint(i)), 0o644))
		must(unix.Setxattr(p, "user.n", []byte(fmt.Sprint(i)), 0))
		must(os.Chown(p, 1000+i, 2000+i%7))
	}
	must(os.Chown(filepath.Join(diff, "ping"), 1000, 1001))
	must(os.Lchown(filepath.Join(diff, "usr/link"), 65534, 65534))
	must(os.Chown(filepath.Join(diff, "loop300"), 0, 6))
	// unix.Chmod: os.Chmod takes Go's mode bits, where 0o4000 is not setuid.
	must(unix.Chmod(filepath.Join(diff, "ping"), 0o4755))
	must(unix.Chmod(filepath.Join(diff, "usr/bin/busybox"), 0o2755))
	must(os.Mkdir(filepath.Join(diff, "tmp"), 0o755))
	must(unix.Chmod(filepath.Join(diff, "tmp"), 0o1777))
	// Last: chown drops security.capability.
	must(unix.Setxattr(filepath.Join(diff, "ping"), "security.capability", capv2, 0))
	must(os.Chown(filepath.Join(root, "storage"), 100000, 100000))
	return root
}

// With AsIs the kernel shows exactly the staged tree (type, mode, owner,
// size, bytes, link count, target, device, xattrs), unsquashfs lists and
// extracts it, and an overlay with a written layer as lowerdir honours its
// whiteout and opaque directory.
func TestAsIsRealReaders(t *testing.T) {
	tree := stageGeneral(t)
	img, p := writeImage(t, tree, 8192, AsIs())
	mnt := mount(t, img, 8192, p.Size())
	treecmp.Compare(t, tree, mnt)

	raw := filepath.Join(t.TempDir(), "raw.sqfs")
	if out, err := exec.Command("dd", "if="+img, "of="+raw, "bs=8192", "skip=1", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v\n%s", err, out)
	}
	out, err := exec.Command("unsquashfs", "-lln", raw).CombinedOutput()
	if err != nil {
		t.Fatalf("unsquashfs -lln: %v\n%s", err, out)
	}
	for _, want := range []string{
		"c--------- 0/0",
		"-rwsr-xr-x 1000/1001", "-rwxr-sr-x 0/0",
		"lrwxrwxrwx 65534/65534",
		"brw-r----- 0/6", // unsquashfs 4.5.1 prints major 7 minor 300 as 4103, 44 (the kernel and extraction: 7:300)
		"prw-r----- 0/0",
		"srwxr-xr-x 0/0",
		"drwxrwxrwt 0/0",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("unsquashfs -lln lacks %q:\n%s", want, grepLines(out, "/diff/"))
		}
	}
	dest := filepath.Join(t.TempDir(), "x")
	if out, err := exec.Command("unsquashfs", "-d", dest, "-no-progress", raw).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, out)
	}
	treecmp.Compare(t, tree, dest)

	treecmp.OverlayLayer(t, filepath.Join(mnt, "storage/overlay/l1/diff"))
}

func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// WithAttrs sets a file's mode and owner in the filesystem without
// touching the tree; a path not in the tree is an error.
func TestWithAttrs(t *testing.T) {
	tree := t.TempDir()
	f := filepath.Join(tree, "blob")
	if err := os.WriteFile(f, []byte("shared with a local layout"), 0o600); err != nil {
		t.Fatal(err)
	}
	attrs := map[string]Attrs{"blob": {Mode: 0o444, UID: 0, GID: 0}}
	img, p := writeImage(t, tree, 0, AsIs(), WithAttrs(attrs))
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(mount(t, img, 0, p.Size()), "blob"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o444 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("blob: mode %o owner %d:%d, want 444 0:0", st.Mode&0o7777, st.Uid, st.Gid)
	}
	if fi, _ := os.Stat(f); fi.Mode().Perm() != 0o600 {
		t.Errorf("the tree's file changed: %v", fi.Mode())
	}
	if _, err := Scan(tree, WithAttrs(map[string]Attrs{"missing": {Mode: 0o644}})); err == nil || !strings.Contains(err.Error(), "missing, which is not in the tree") {
		t.Errorf("attrs of a missing path: %v", err)
	}
}

// AsIs refuses an xattr squashfs has no namespace for, naming file and xattr.
func TestAsIsRefusesOtherXattrs(t *testing.T) {
	var x xattrSets
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// system.posix_acl_access holds an ACL: version 2, user::rw-, group::r--, mask::r--, other::r--, user 1000 rw-.
	acl := []byte{2, 0, 0, 0,
		1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff,
		2, 0, 6, 0, 0xe8, 0x03, 0, 0,
		4, 0, 4, 0, 0xff, 0xff, 0xff, 0xff,
		0x10, 0, 6, 0, 0xff, 0xff, 0xff, 0xff,
		0x20, 0, 4, 0, 0xff, 0xff, 0xff, 0xff}
	if err := unix.Setxattr(f, "system.posix_acl_access", acl, 0); err != nil {
		t.Fatalf("set an ACL: %v", err)
	}
	if _, err := x.read(f, "dir/f"); err == nil || !strings.Contains(err.Error(), `dir/f has xattr "system.posix_acl_access"`) {
		t.Errorf("read an ACL: %v", err)
	}
}

// WriteFile writes a new file, refuses to overwrite one and leaves nothing
// when the write fails.
func TestWriteFile(t *testing.T) {
	tree, dir := stageGeneral(t), t.TempDir()
	img := filepath.Join(dir, "fs.sqfs")
	if err := WriteFile(context.Background(), tree, img, AsIs()); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	treecmp.Compare(t, tree, mount(t, img, 0, st.Size()))
	if err := WriteFile(context.Background(), tree, img, AsIs()); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("WriteFile over an existing file: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	failed := filepath.Join(dir, "cancelled.sqfs")
	if err := WriteFile(ctx, tree, failed, AsIs()); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled WriteFile: %v", err)
	}
	if _, err := os.Lstat(failed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed WriteFile left %s: %v", failed, err)
	}
}
