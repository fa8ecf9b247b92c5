// Package rawdisk reads and writes files inside the partitions of a raw disk
// image, offline, without loop devices or mounts: e2fsprogs' debugfs for ext4
// (it opens "disk.raw?offset=N") and mtools for FAT ("disk.raw@@N").
//
// The e2e tests use it to put an Ignition config on a base disk before a boot
// and to inspect what the guest left behind after it powered off.
package rawdisk

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/gpt"
)

// Partition locates one GPT partition inside a disk image file.
type Partition struct {
	Disk   string // path of the disk image
	Name   string // GPT partition name, e.g. "boot"
	Index  int    // 1-based partition number
	Offset int64  // byte offset of the first sector
	Size   int64  // bytes
}

// Find returns the partition whose GPT name is name.
func Find(disk, name string) (Partition, error) {
	d, err := diskfs.Open(disk, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		return Partition{}, fmt.Errorf("open disk image %s: %w", disk, err)
	}
	defer d.Close()
	pt, err := d.GetPartitionTable()
	if err != nil {
		return Partition{}, fmt.Errorf("read partition table of %s: %w", disk, err)
	}
	table, ok := pt.(*gpt.Table)
	if !ok {
		return Partition{}, fmt.Errorf("%s: partition table is %s, want GPT", disk, pt.Type())
	}
	var names []string
	for i, p := range table.Partitions {
		if p.Name == name {
			return Partition{Disk: disk, Name: name, Index: i + 1,
				Offset: p.GetStart(), Size: p.GetSize()}, nil
		}
		if p.Name != "" {
			names = append(names, p.Name)
		}
	}
	return Partition{}, fmt.Errorf("%s: no GPT partition named %q (have %s)", disk, name, strings.Join(names, ", "))
}

// debugfs runs debugfs on an ext4 partition with the given commands and
// returns its stdout. debugfs exits 0 even when a command fails, so any
// stderr line other than its version banner is an error.
func (p Partition) debugfs(write bool, commands ...string) ([]byte, error) {
	args := []string{"-f", "-"}
	if write {
		args = append([]string{"-w"}, args...)
	}
	args = append(args, fmt.Sprintf("%s?offset=%d", p.Disk, p.Offset))
	cmd := exec.Command("debugfs", args...)
	cmd.Stdin = strings.NewReader(strings.Join(commands, "\n") + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var problems []string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "debugfs ") {
			problems = append(problems, l)
		}
	}
	if err != nil || len(problems) > 0 {
		return nil, fmt.Errorf("debugfs on partition %q of %s: %v %s", p.Name, p.Disk, err, strings.Join(problems, "; "))
	}
	return stdout.Bytes(), nil
}

// ReadFile returns the contents of the file at abs path name on an ext4
// partition. For small files (configs, markers); use CopyOut for big ones.
func (p Partition) ReadFile(name string) ([]byte, error) {
	tmp, err := os.CreateTemp("", "rawdisk-read-*")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := p.CopyOut(name, tmp.Name()); err != nil {
		return nil, err
	}
	return os.ReadFile(tmp.Name())
}

// CopyOut copies a file or a directory tree from an ext4 partition to dst on
// the host; a directory tree lands in dst/<base name>.
func (p Partition) CopyOut(name, dst string) error {
	st, err := p.debugfs(false, "stat "+quote(name))
	if err != nil {
		return err
	}
	cmd := "dump -p " + quote(name) + " " + quote(dst)
	if bytes.Contains(st, []byte("Type: directory")) {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		cmd = "rdump " + quote(name) + " " + quote(dst)
	}
	_, err = p.debugfs(false, cmd)
	return err
}

// WriteFile writes data to the file at abs path name on an ext4 partition,
// creating missing parent directories and replacing an existing file. The
// file gets mode perm, owner root.
func (p Partition) WriteFile(name string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp("", "rawdisk-write-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	name = path.Clean("/" + name)
	var mkdirs []string
	for dir := path.Dir(name); dir != "/"; dir = path.Dir(dir) {
		mkdirs = append([]string{dir}, mkdirs...)
	}
	for _, dir := range mkdirs {
		// mkdir of an existing directory fails; only create what is missing.
		if _, err := p.debugfs(false, "stat "+quote(dir)); err != nil {
			if _, err := p.debugfs(true, "mkdir "+quote(dir)); err != nil {
				return err
			}
		}
	}
	if _, err := p.debugfs(false, "stat "+quote(name)); err == nil {
		if _, err := p.debugfs(true, "rm "+quote(name)); err != nil {
			return err
		}
	}
	_, err = p.debugfs(true,
		"write "+quote(tmp.Name())+" "+quote(name),
		fmt.Sprintf("sif %s mode 0%o", quote(name), 0o100000|uint32(perm.Perm())),
		"sif "+quote(name)+" uid 0",
		"sif "+quote(name)+" gid 0")
	return err
}

// Exists reports whether abs path name exists on an ext4 partition.
func (p Partition) Exists(name string) bool {
	_, err := p.debugfs(false, "stat "+quote(name))
	return err == nil
}

// FATList lists the names in directory dir of a FAT partition (e.g. the ESP).
func (p Partition) FATList(dir string) ([]string, error) {
	cmd := exec.Command("mdir", "-b", "-i", fmt.Sprintf("%s@@%d", p.Disk, p.Offset), "::"+dir)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("mdir %s on partition %q of %s: %v: %s", dir, p.Name, p.Disk, err, out)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			names = append(names, path.Base(strings.TrimSuffix(l, "/")))
		}
	}
	return names, nil
}

// FATRename renames file from to to on a FAT partition (e.g. a boot loader
// entry on the ESP, as systemd-boot and systemd-bless-boot rename them).
func (p Partition) FATRename(from, to string) error {
	cmd := exec.Command("mren", "-i", fmt.Sprintf("%s@@%d", p.Disk, p.Offset), "::"+from, "::"+to)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mren %s %s on partition %q of %s: %v: %s", from, to, p.Name, p.Disk, err, out)
	}
	return nil
}

// Copy copies the disk image src to dst, keeping holes, so every boot can
// start from a pristine copy of a cached base image.
func Copy(dst, src string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	out, err := exec.Command("cp", "--sparse=always", "--reflink=auto", src, tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("copy disk image %s: %v: %s", src, err, out)
	}
	return os.Rename(tmp, dst)
}

// quote quotes a path for debugfs' command parser.
func quote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}
