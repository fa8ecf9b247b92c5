package inputfile

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, []byte("content"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	linkToFile := filepath.Join(dir, "linkToFile")
	if err := os.Symlink(regular, linkToFile); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		path string
		want string // "" for success; else in the error
	}{
		{regular, ""},
		{linkToFile, ""},
		{fifo, fifo + " is a FIFO (named pipe), not a regular file or block device"},
		{link, link + " is a FIFO (named pipe), not a regular file or block device"},
		{dir, dir + " is a directory, not a regular file or block device"},
		{"/dev/null", "/dev/null is a character device, not a regular file or block device"},
		{sock, "no such device or address"}, // a socket cannot be opened at all
		{filepath.Join(dir, "missing"), "no such file or directory"},
	} {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			// Open must return at once: before the fix, a FIFO blocked here
			// for good, waiting for a writer.
			done := make(chan error, 1)
			go func() {
				f, err := Open(tc.path)
				if err == nil {
					f.Close()
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("Open(%s) blocked", tc.path)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Open(%s): %v", tc.path, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Open(%s): %v, want an error with %q", tc.path, err, tc.want)
			}
			if strings.Contains(tc.want, ", not a") && !errors.Is(err, ErrNotFile) {
				t.Errorf("Open(%s): %v does not wrap ErrNotFile", tc.path, err)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(p, 5); err != nil || string(b) != "12345" {
		t.Errorf("ReadFile at the limit: %q, %v", b, err)
	}
	var tl *TooLargeError
	if _, err := ReadFile(p, 4); !errors.As(err, &tl) || tl.Limit != 4 || !strings.Contains(err.Error(), p+" is 5 bytes, over the limit of 4 (4 B)") {
		t.Errorf("ReadFile over the limit: %v, want a TooLargeError naming both sizes", err)
	}
	if b, err := ReadFile(p, -1); err != nil || string(b) != "12345" {
		t.Errorf("ReadFile without a limit: %q, %v", b, err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "none"), 4); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile of a missing file: %v, want fs.ErrNotExist", err)
	}
}

// TestBlockDevice: a disk (a loop device here, as a USB stick would be) is
// an input Open takes and OpenFile, for files only, refuses.
func TestBlockDevice(t *testing.T) {
	backing := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(backing, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v\n%s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	f, err := Open(loop)
	if err != nil {
		t.Fatalf("Open(%s): %v", loop, err)
	}
	f.Close()
	if _, err := OpenFile(loop); err == nil || !strings.Contains(err.Error(), loop+" is a block device, not a regular file") {
		t.Errorf("OpenFile(%s): %v, want a block device refused", loop, err)
	}
}

// TestNoFollow: with NoFollow a symlink is refused, even to a regular file,
// by every way of opening; the file itself is still read.
func TestNoFollow(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, []byte("content"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(regular, link); err != nil {
		t.Fatal(err)
	}
	want := link + " is a symbolic link, not a regular file"
	if _, err := OpenFile(link, NoFollow()); err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrNotFile) {
		t.Errorf("OpenFile(link, NoFollow): %v, want %q", err, want)
	}
	if _, err := ReadFile(link, -1, NoFollow()); err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrNotFile) {
		t.Errorf("ReadFile(link, NoFollow): %v, want %q", err, want)
	}
	if _, err := Open(link, NoFollow()); err == nil || !strings.Contains(err.Error(), link+" is a symbolic link, not a regular file or block device") {
		t.Errorf("Open(link, NoFollow): %v", err)
	}
	if b, err := ReadFile(regular, -1, NoFollow()); err != nil || string(b) != "content" {
		t.Errorf("ReadFile(file, NoFollow): %q, %v", b, err)
	}
	f, err := OpenFile(regular, NoFollow())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := CheckSize(f, 6); err == nil || !strings.Contains(err.Error(), "is 7 bytes, over the limit of 6 (6 B)") {
		t.Errorf("CheckSize over the limit: %v", err)
	}
	if err := CheckSize(f, 7); err != nil {
		t.Errorf("CheckSize at the limit: %v", err)
	}
}

// TestReadFileNotFile: ReadFile gives what OpenFile gives for anything but
// a regular file, and never blocks on a FIFO.
func TestReadFileNotFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		fifo:        fifo + " is a FIFO (named pipe), not a regular file",
		dir:         dir + " is a directory, not a regular file",
		"/dev/null": "/dev/null is a character device, not a regular file",
	} {
		if _, err := ReadFile(path, -1); err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrNotFile) {
			t.Errorf("ReadFile(%s): %v, want %q", path, err, want)
		}
	}
}
