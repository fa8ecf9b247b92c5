// Package esp reads and writes files of an EFI system partition (FAT)
// inside a disk file, with mtools and without mounting: mtools opens the
// filesystem at the partition's offset ("FILE@@OFFSET"). Paths are
// slash-separated, relative to the ESP's root.
package esp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-appliance/kiln/internal/hosttools"
)

// FS is an ESP: the FAT filesystem at Offset in the disk file Disk.
type FS struct {
	Disk   string
	Offset int64
	// Epoch, when not 0, is the time of every file and directory written
	// (mtools' SOURCE_DATE_EPOCH, and the copied files' mtime): the same
	// inputs give the same bytes.
	Epoch int64
}

// ErrNotExist is what Read returns for a file the ESP does not hold.
var ErrNotExist = errors.New("not on the ESP")

func (f FS) image() string { return fmt.Sprintf("%s@@%d", f.Disk, f.Offset) }

// run runs cmd, an mtools command on the ESP (made by the callers with
// exec.Command and the tool's name, so the host tools' table test sees it).
func (f FS) run(what string, cmd *exec.Cmd) ([]byte, error) {
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if f.Epoch != 0 {
		cmd.Env = append(cmd.Env, "SOURCE_DATE_EPOCH="+strconv.FormatInt(f.Epoch, 10))
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if errors.Is(err, exec.ErrNotFound) {
		return nil, hosttools.RunError(what, err, nil)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "Disk full") || strings.Contains(msg, "No free") {
			return nil, fmt.Errorf("%s: the ESP is full (%s): the base's EFI system partition has no room for it; give the base a larger one", what, msg)
		}
		return nil, fmt.Errorf("%s: %s: %v: %s", what, filepath.Base(cmd.Path), err, msg)
	}
	return out, nil
}

// Read returns the bytes of the file p; ErrNotExist when there is none.
func (f FS) Read(p, tmpDir string) ([]byte, error) {
	d, err := os.MkdirTemp(tmpDir, "kiln-esp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(d)
	dst := filepath.Join(d, "file")
	if err := f.CopyOut(p, dst); err != nil {
		return nil, err
	}
	return os.ReadFile(dst)
}

// CopyOut copies the file p into the local file dst; ErrNotExist when
// there is none.
func (f FS) CopyOut(p, dst string) error {
	if ok, err := f.Exists(p); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("%s: %w", p, ErrNotExist)
	}
	_, err := f.run("read "+p+" from the ESP", exec.Command("mcopy", "-n", "-i", f.image(), "::/"+p, dst))
	return err
}

// Exists says whether the ESP holds p (a file or directory).
func (f FS) Exists(p string) (bool, error) {
	dir, name := path.Split(p)
	out, err := f.run("list /"+dir+" on the ESP", exec.Command("mdir", "-b", "-i", f.image(), "::/"+strings.TrimSuffix(dir, "/")))
	if err != nil {
		// mdir fails for a directory that is not there.
		if dir != "" {
			if ok, err2 := f.Exists(strings.TrimSuffix(dir, "/")); err2 == nil && !ok {
				return false, nil
			}
		}
		return false, err
	}
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSuffix(strings.TrimSpace(l), "/")
		if strings.EqualFold(path.Base(l), name) && l != "" {
			return true, nil
		}
	}
	return false, nil
}

// Write writes data as the file p, replacing one there, making its
// directories.
func (f FS) Write(p string, data []byte, tmpDir string) error {
	d, err := os.MkdirTemp(tmpDir, "kiln-esp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(d)
	src := filepath.Join(d, path.Base(p))
	if err := os.WriteFile(src, data, 0o644); err != nil {
		return err
	}
	return f.CopyIn(src, p)
}

// CopyIn copies the local file src to p on the ESP, replacing one there,
// making its directories.
func (f FS) CopyIn(src, p string) error {
	if err := f.MkdirAll(path.Dir(p)); err != nil {
		return err
	}
	args := []string{"-o", "-i", f.image()}
	if f.Epoch != 0 {
		t := time.Unix(f.Epoch, 0)
		if err := os.Chtimes(src, t, t); err != nil {
			return err
		}
		args = append(args, "-m")
	}
	_, err := f.run("write "+p+" on the ESP", exec.Command("mcopy", append(args, src, "::/"+p)...))
	return err
}

// MkdirAll makes the directory p and its parents where missing.
func (f FS) MkdirAll(p string) error {
	if p == "." || p == "" || p == "/" {
		return nil
	}
	if ok, err := f.Exists(p); err != nil || ok {
		return err
	}
	if err := f.MkdirAll(path.Dir(p)); err != nil {
		return err
	}
	_, err := f.run("make /"+p+" on the ESP", exec.Command("mmd", "-i", f.image(), "::/"+p))
	return err
}

// Remove removes the file p.
func (f FS) Remove(p string) error {
	_, err := f.run("remove "+p+" from the ESP", exec.Command("mdel", "-i", f.image(), "::/"+p))
	return err
}

// List returns the names of the regular files in the directory dir; none
// when there is no such directory.
func (f FS) List(dir string) ([]string, error) {
	if ok, err := f.Exists(dir); err != nil || !ok {
		return nil, err
	}
	out, err := f.run("list /"+dir+" on the ESP", exec.Command("mdir", "-b", "-i", f.image(), "::/"+dir))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasSuffix(l, "/") { // a directory
			continue
		}
		names = append(names, path.Base(l))
	}
	return names, nil
}
