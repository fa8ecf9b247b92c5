package sqfswrite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	mrand "math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/test/loopmount"
	"github.com/kiln-appliance/kiln/test/treecmp"
)

const (
	mib   = 1 << 20
	epoch = 1700000000
)

// stageTree builds a tree with what a bundle has and the edge cases of the
// format: empty files, a file of exactly one block and one a byte past two,
// a directory of 1,500 entries (several directory headers and metadata
// blocks: an extended inode with an index), an empty directory, a deep
// path and assorted modes.
func stageTree(t testing.TB) string {
	t.Helper()
	tree := t.TempDir()
	write := func(rel string, data []byte, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(tree, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	write("oci/oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	write("oci/index.json", []byte(`{"schemaVersion":2}`), 0o644)
	write("bin/kiln", bytes.Repeat([]byte("agent"), 300_000), 0o755)
	write("empty", nil, 0o644)
	write("oci/blobs/sha256/exact", bytes.Repeat([]byte{0xa5}, mib), 0o444)
	write("oci/blobs/sha256/two-and-a-byte", append(bytes.Repeat([]byte("b"), 2*mib), 'c'), 0o444)
	write("release/etc/kiln/release/secret", []byte("0600"), 0o600)
	write("zz-setgid", []byte("g"), 0o2755)
	for i := range 1500 {
		write(fmt.Sprintf("many/blob-with-a-long-name-%04d", i), []byte(fmt.Sprint(i)), 0o644)
	}
	deep := filepath.Join(strings.Repeat("d/", 40), "bottom")
	write(deep, []byte("deep"), 0o644)
	if err := os.Mkdir(filepath.Join(tree, "an-empty-dir"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(tree, "an-empty-dir"), 0o750); err != nil {
		t.Fatal(err)
	}
	return tree
}

// writeImage writes tree's filesystem at offset of a new file and returns
// the file and the plan.
func writeImage(t testing.TB, tree string, offset int64, opts ...Option) (string, *Plan) {
	t.Helper()
	p, err := Scan(tree, append([]Option{WithModTime(epoch)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "fs.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var progress counter
	if err := p.Write(context.Background(), f, offset, &progress); err != nil {
		t.Fatal(err)
	}
	if int64(progress) != p.DataBytes() {
		t.Errorf("progress counted %d bytes of the %d in files", progress, p.DataBytes())
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != offset+p.Size() || p.Size()%4096 != 0 {
		t.Fatalf("image is %d bytes, want %d + a filesystem of %d (a multiple of 4 KiB)", st.Size(), offset, p.Size())
	}
	return img, p
}

type counter int64

func (c *counter) Write(b []byte) (int, error) { *c += counter(len(b)); return len(b), nil }

// The real readers — unsquashfs and the kernel — see exactly the tree:
// every directory and file with its mode, owner root, mtime, size and
// bytes; Files gives each file's true byte range.
func TestRealToolsReadTheTree(t *testing.T) {
	tree := stageTree(t)
	const offset = 3 * 4096
	img, plan := writeImage(t, tree, offset)

	t.Run("files at their offsets", func(t *testing.T) {
		f, err := os.Open(img)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		n := 0
		for _, file := range plan.Files() {
			want, err := os.ReadFile(filepath.Join(tree, file.Path))
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, file.Size)
			if _, err := f.ReadAt(got, offset+file.Offset); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) || int64(len(want)) != file.Size {
				t.Errorf("%s: the %d bytes at offset %d are not the file's", file.Path, file.Size, file.Offset)
			}
			n++
		}
		if n != 1509 {
			t.Errorf("Files lists %d files, want 1509", n)
		}
	})

	t.Run("unsquashfs lists", func(t *testing.T) {
		out, err := exec.Command("unsquashfs", "-lln", "-o", fmt.Sprint(offset), img).CombinedOutput()
		if err != nil {
			t.Fatalf("unsquashfs -lln: %v\n%s", err, out)
		}
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			if len(f) == 6 && strings.HasPrefix(f[5], "squashfs-root") {
				got[strings.TrimPrefix(strings.TrimPrefix(f[5], "squashfs-root"), "/")] = strings.Join(f[:3], " ")
			}
		}
		want := map[string]string{}
		filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			info, _ := d.Info()
			rel, _ := filepath.Rel(tree, p)
			if rel == "." {
				rel = ""
			}
			size := info.Size()
			if d.IsDir() {
				size = -1 // unsquashfs prints squashfs's own directory sizes
			}
			want[filepath.ToSlash(rel)] = fmt.Sprintf("%s 0/0 %d", lsMode(info.Mode()), size)
			return nil
		})
		if len(got) != len(want) {
			t.Errorf("unsquashfs lists %d entries, the tree has %d", len(got), len(want))
		}
		for k, w := range want {
			g, ok := got[k]
			if strings.HasSuffix(w, " -1") && ok { // a directory: compare mode and owner
				g = g[:strings.LastIndex(g, " ")] + " -1"
			}
			if g != w {
				t.Errorf("%q: unsquashfs says %q, want %q", k, g, w)
			}
		}
	})

	t.Run("unsquashfs extracts", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "x")
		if out, err := exec.Command("unsquashfs", "-q", "-n", "-o", fmt.Sprint(offset), "-d", dest, img).CombinedOutput(); err != nil {
			t.Fatalf("unsquashfs: %v\n%s", err, out)
		}
		sameTree(t, tree, dest, true)
	})

	t.Run("kernel mounts", func(t *testing.T) {
		mnt := mount(t, img, offset, plan.Size())
		sameTree(t, tree, mnt, true)
		// Look every name of the large directory up on its own: the
		// kernel's lookup starts from the directory index.
		for i := 1499; i >= 0; i-- {
			name := fmt.Sprintf("blob-with-a-long-name-%04d", i)
			b, err := os.ReadFile(filepath.Join(mnt, "many", name))
			if err != nil || string(b) != fmt.Sprint(i) {
				t.Fatalf("many/%s: %q, %v", name, b, err)
			}
		}
		for _, name := range []string{"blob-with-a-long-name-1500", "a", "zzz", "blob-with-a-long-name-0500x"} {
			if _, err := os.Stat(filepath.Join(mnt, "many", name)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("many/%s: %v, want not found", name, err)
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(mnt, "bin/kiln"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 0 || st.Gid != 0 || st.Mtim.Sec != epoch {
			t.Errorf("bin/kiln: uid %d gid %d mtime %d, want 0 0 %d", st.Uid, st.Gid, st.Mtim.Sec, epoch)
		}
		if err := unix.Stat(filepath.Join(mnt, "oci"), &st); err != nil || st.Nlink != 3 {
			t.Errorf("oci: nlink %d (%v), want 3 (itself, its entry, blobs)", st.Nlink, err)
		}
	})
}

// lsMode is a mode as ls (and unsquashfs) print it.
func lsMode(m fs.FileMode) string {
	s := []byte("-rwxrwxrwx")
	if m.IsDir() {
		s[0] = 'd'
	}
	for i := range 9 {
		if m&(1<<(8-i)) == 0 {
			s[1+i] = '-'
		}
	}
	if m&fs.ModeSetgid != 0 {
		s[6] = map[byte]byte{'x': 's', '-': 'S'}[s[6]]
	}
	if m&fs.ModeSetuid != 0 {
		s[3] = map[byte]byte{'x': 's', '-': 'S'}[s[3]]
	}
	if m&fs.ModeSticky != 0 {
		s[9] = map[byte]byte{'x': 't', '-': 'T'}[s[9]]
	}
	return string(s)
}

// sameTree compares two trees: names, types, modes, sizes and bytes.
func sameTree(t *testing.T, want, got string, modes bool) {
	t.Helper()
	seen := 0
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		wi, err := d.Info()
		if err != nil {
			return err
		}
		gi, err := os.Lstat(filepath.Join(got, rel))
		if err != nil {
			return err
		}
		seen++
		if rel != "." && modes && wi.Mode() != gi.Mode() {
			t.Errorf("%s: mode %v, want %v", rel, gi.Mode(), wi.Mode())
		}
		if d.IsDir() {
			return nil
		}
		if gi.Size() != wi.Size() {
			t.Errorf("%s: %d bytes, want %d", rel, gi.Size(), wi.Size())
			return nil
		}
		if hashFile(t, p) != hashFile(t, filepath.Join(got, rel)) {
			t.Errorf("%s: contents differ", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	filepath.WalkDir(got, func(string, fs.DirEntry, error) error { n++; return nil })
	if n != seen {
		t.Errorf("%s has %d entries, %s %d", got, n, want, seen)
	}
}

func hashFile(t testing.TB, p string) string { return treecmp.SHA256File(t, p) }

// mount mounts the filesystem at offset of img read-only through a loop
// device, as the bundle docs tell a person to look inside.
func mount(t *testing.T, img string, offset, size int64) string {
	return loopmount.Squashfs(t, img, offset, size)
}

// The same tree gives the same bytes; another mtime gives others.
func TestReproducible(t *testing.T) {
	tree := stageTree(t)
	a, _ := writeImage(t, tree, 0)
	b, _ := writeImage(t, tree, 0)
	if hashFile(t, a) != hashFile(t, b) {
		t.Fatal("two writes of the same tree differ")
	}
	c, _ := writeImage(t, tree, 0, WithModTime(epoch+1))
	if hashFile(t, a) == hashFile(t, c) {
		t.Fatal("another mtime gave the same bytes")
	}
}

// What the writer cannot store is refused, naming the path and what it is.
func TestRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, p string) error
		want string
	}{
		{"symlink", func(t *testing.T, p string) error { return os.Symlink("elsewhere", p) }, "is a symlink"},
		{"fifo", func(t *testing.T, p string) error { return unix.Mkfifo(p, 0o644) }, "is a FIFO"},
		{"char device", func(t *testing.T, p string) error { return unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))) }, "is a device"},
		{"block device", func(t *testing.T, p string) error { return unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))) }, "is a device"},
		{"socket", func(t *testing.T, p string) error {
			l, err := net.Listen("unix", p)
			if err == nil {
				t.Cleanup(func() { l.Close() })
			}
			return err
		}, "is a socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := t.TempDir()
			if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(t, filepath.Join(tree, "sub", "odd")); err != nil {
				t.Fatal(err)
			}
			_, err := Scan(tree)
			if err == nil || !strings.Contains(err.Error(), "sub/odd "+tc.want) {
				t.Fatalf("Scan: %v, want an error saying sub/odd %s", err, tc.want)
			}
		})
	}
	t.Run("not a directory", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "f")
		os.WriteFile(f, nil, 0o644)
		if _, err := Scan(f); err == nil || !strings.Contains(err.Error(), "is not a directory") {
			t.Fatalf("Scan of a file: %v", err)
		}
	})
	t.Run("mtime out of range", func(t *testing.T) {
		for _, m := range []int64{-1, 1 << 32} {
			if _, err := Scan(t.TempDir(), WithModTime(m)); err == nil || !strings.Contains(err.Error(), "2106") {
				t.Errorf("mtime %d: %v", m, err)
			}
		}
	})
	t.Run("names", func(t *testing.T) {
		// No Linux filesystem holds a name over 255 bytes, so the
		// check is tested on its own.
		if err := check("a/"+strings.Repeat("n", 257), strings.Repeat("n", 257), 0o644, false); err == nil || !strings.Contains(err.Error(), "at most 256") {
			t.Errorf("257-byte name: %v", err)
		}
		if err := check("a/"+strings.Repeat("n", 256), strings.Repeat("n", 256), 0o644, false); err != nil {
			t.Errorf("256-byte name: %v", err)
		}
		if err := check("a/..", "..", 0o644, false); err == nil {
			t.Error("name ..: no error")
		}
	})
	t.Run("a file changed after the scan", func(t *testing.T) {
		tree := t.TempDir()
		os.WriteFile(filepath.Join(tree, "f"), []byte("four"), 0o644)
		p, err := Scan(tree)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(tree, "f"), []byte("five!"), 0o644)
		f, _ := os.Create(filepath.Join(t.TempDir(), "img"))
		defer f.Close()
		if err := p.Write(context.Background(), f, 0, nil); err == nil || !strings.Contains(err.Error(), "changed while the filesystem was written") {
			t.Fatalf("Write: %v", err)
		}
	})
	t.Run("output already holds bytes there", func(t *testing.T) {
		p, err := Scan(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		f, _ := os.Create(filepath.Join(t.TempDir(), "img"))
		defer f.Close()
		f.Write(make([]byte, 8192))
		if err := p.Write(context.Background(), f, 4096, nil); err == nil || !strings.Contains(err.Error(), "written past its end") {
			t.Fatalf("Write over existing bytes: %v", err)
		}
		if err := p.Write(context.Background(), f, 8192, nil); err != nil {
			t.Fatalf("Write at the end: %v", err)
		}
	})
}

// Where the kernel refuses copy_file_range (here: from tmpfs to another
// filesystem) the contents are copied through user space, the same bytes.
func TestCopyAcrossFilesystems(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "sqfswrite-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	data := bytes.Repeat([]byte("across"), 3*mib)
	if err := os.WriteFile(filepath.Join(shm, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	// The premise: this kernel refuses the pair.
	in, _ := os.Open(filepath.Join(shm, "f"))
	defer in.Close()
	probe, _ := os.Create(filepath.Join(t.TempDir(), "probe"))
	defer probe.Close()
	if _, err := unix.CopyFileRange(int(in.Fd()), nil, int(probe.Fd()), nil, 10, 0); !fallback(err) {
		t.Fatalf("copy_file_range tmpfs → %s: %v; the test needs a pair the kernel refuses", probe.Name(), err)
	}
	img, plan := writeImage(t, shm, 0)
	mnt := mount(t, img, 0, plan.Size())
	sameTree(t, shm, mnt, false)
}

// A file over 4 GiB (sparse: holes in the source stay holes in the
// output) and one stored past byte 2^32 get extended inodes the real tools
// read.
func TestOver4GiB(t *testing.T) {
	tree := t.TempDir()
	const big = 4<<30 + 5*mib + 123
	f, err := os.Create(filepath.Join(tree, "a-big"))
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []int64{0, 3 << 30, big - 4096} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(at >> 20)}, 4096), at); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(tree, "b-after"), []byte("past four GiB"), 0o644); err != nil {
		t.Fatal(err)
	}
	img, plan := writeImage(t, tree, 4096)
	files := plan.Files()
	if files[1].Path != "b-after" || files[1].Offset < 1<<32 {
		t.Fatalf("files: %+v, want b-after past 2^32", files)
	}
	st, _ := os.Stat(img)
	var sys unix.Stat_t
	unix.Stat(img, &sys)
	if sys.Blocks*512 > 64*mib {
		t.Errorf("the image allocates %d bytes of its %d: the source's holes were written", sys.Blocks*512, st.Size())
	}

	out, err := exec.Command("unsquashfs", "-q", "-o", "4096", "-cat", img, "b-after").CombinedOutput()
	if err != nil || string(out) != "past four GiB" {
		t.Errorf("unsquashfs -cat b-after: %q, %v", out, err)
	}
	out, err = exec.Command("unsquashfs", "-lln", "-o", "4096", img).CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf(" %d ", big)) {
		t.Errorf("unsquashfs -lln does not list a-big at %d bytes: %v\n%s", big, err, out)
	}
	mnt := mount(t, img, 4096, plan.Size())
	if b, err := os.ReadFile(filepath.Join(mnt, "b-after")); err != nil || string(b) != "past four GiB" {
		t.Errorf("kernel: b-after %q, %v", b, err)
	}
	m, err := os.Open(filepath.Join(mnt, "a-big"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, at := range []int64{0, 3 << 30, big - 4096, 2 << 30} {
		want := bytes.Repeat([]byte{byte(at >> 20)}, 4096)
		if at == 2<<30 {
			want = make([]byte, 4096) // a hole
		}
		got := make([]byte, 4096)
		if _, err := m.ReadAt(got, at); err != nil || !bytes.Equal(got, want) {
			t.Errorf("kernel: a-big at %d: %v (bytes differ: %v)", at, err, !bytes.Equal(got, want))
		}
	}
	if st, err := m.Stat(); err != nil || st.Size() != big {
		t.Errorf("kernel: a-big is %v bytes (%v), want %d", st.Size(), err, big)
	}
}

// A directory of 33,000 empty files (their inodes fill 129 metadata
// blocks exactly, 256 to a block: the most a directory run may hold), and
// siblings of it whose inode numbers lie 33,000 apart. The kernel and
// unsquashfs read them all, and the kernel numbers the inodes as written.
func TestLargeDirectories(t *testing.T) {
	tree := t.TempDir()
	os.WriteFile(filepath.Join(tree, "a"), []byte("first"), 0o644)
	os.Mkdir(filepath.Join(tree, "b"), 0o755)
	const n = 33000
	for i := range n {
		f, err := os.Create(filepath.Join(tree, "b", fmt.Sprintf("%05d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	os.WriteFile(filepath.Join(tree, "c"), []byte("last"), 0o644)
	img, plan := writeImage(t, tree, 0)

	out, err := exec.Command("unsquashfs", "-lln", img).CombinedOutput()
	if err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, out)
	}
	if lines := strings.Count(string(out), "\n"); lines != n+4 { // root, a, b, c and the files
		t.Errorf("unsquashfs lists %d entries, want %d", lines, n+4)
	}
	mnt := mount(t, img, 0, plan.Size())
	for name, want := range map[string]string{"a": "first", "c": "last"} {
		if b, err := os.ReadFile(filepath.Join(mnt, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", name, b, err)
		}
	}
	entries, err := os.ReadDir(filepath.Join(mnt, "b"))
	if err != nil || len(entries) != n {
		t.Fatalf("readdir b: %d entries, %v", len(entries), err)
	}
	for i := 0; i < n; i += 97 {
		if _, err := os.Stat(filepath.Join(mnt, "b", fmt.Sprintf("%05d", i))); err != nil {
			t.Fatal(err)
		}
	}
	var st unix.Stat_t
	for _, name := range []string{"a", "b", "c"} {
		if err := unix.Stat(filepath.Join(mnt, name), &st); err != nil {
			t.Fatal(err)
		}
	}
	if st.Ino != n+3 { // post-order: a, b's files, b, c
		t.Errorf("c is inode %d, want %d", st.Ino, n+3)
	}
}

// Random trees — names of 1 to 255 bytes (any byte but '/' and NUL),
// directories nested at random, files of random sizes — read back by the
// kernel: every name looked up on its own (through the directory index),
// every directory listed, every file's bytes compared. Seeded: the same
// trees every run.
func TestRandomTrees(t *testing.T) {
	for seed := range int64(3) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := mrand.New(mrand.NewSource(seed))
			tree := t.TempDir()
			dirs := []string{tree}
			seen := map[string]bool{}
			for range 2500 {
				parent := dirs[rng.Intn(len(dirs))]
				name := make([]byte, 1+rng.Intn(255))
				for i := range name {
					name[i] = byte(1 + rng.Intn(255))
					if name[i] == '/' {
						name[i] = 'x'
					}
				}
				p := filepath.Join(parent, string(name))
				if string(name) == "." || string(name) == ".." || seen[p] {
					continue
				}
				seen[p] = true
				if rng.Intn(20) == 0 {
					if err := os.Mkdir(p, 0o755); err != nil {
						t.Fatal(err)
					}
					dirs = append(dirs, p)
					continue
				}
				data := make([]byte, rng.Intn(3*4096))
				rng.Read(data)
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			img, plan := writeImage(t, tree, 0)
			mnt := mount(t, img, 0, plan.Size())
			sameTree(t, tree, mnt, true)
			for p := range seen {
				rel, _ := filepath.Rel(tree, p)
				if _, err := os.Lstat(filepath.Join(mnt, rel)); err != nil {
					t.Errorf("lookup: %v", err)
				}
			}
		})
	}
}
