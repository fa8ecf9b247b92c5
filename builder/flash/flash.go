// Package flash writes a disk or stick image onto a whole block device on
// the factory host (`kiln write`) and proves it by reading every byte back.
// It refuses, before writing anything, devices that are not whole disks,
// are in use, are not removable (unless forced) or are too small.
package flash

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/progress"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Device is a whole block device as sysfs describes it.
type Device struct {
	Path      string // as given
	Name      string // kernel name, e.g. sdb, loop3
	Size      int64
	Removable bool
	ReadOnly  bool
	sys       string   // /sys/dev/block/MAJ:MIN, resolved
	devs      []string // MAJ:MIN of the disk and each of its partitions
}

// Open describes the block device at path, refusing anything else.
func Open(path string) (*Device, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", path, err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return nil, fmt.Errorf("%s is not a block device: give the stick's whole device, e.g. /dev/sdb (lsblk lists them); "+
			"to copy an image to a file, use cp", path)
	}
	var s unix.Stat_t
	if err := unix.Stat(path, &s); err != nil {
		return nil, fmt.Errorf("device %s: %w", path, err)
	}
	majmin := fmt.Sprintf("%d:%d", unix.Major(s.Rdev), unix.Minor(s.Rdev))
	sys, err := filepath.EvalSymlinks("/sys/dev/block/" + majmin)
	if err != nil {
		return nil, fmt.Errorf("device %s (%s): not in /sys/dev/block: %w", path, majmin, err)
	}
	d := &Device{Path: path, Name: filepath.Base(sys), sys: sys, devs: []string{majmin}}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		return nil, fmt.Errorf("%s is partition %s of a disk: give the whole device (%s), the image carries its own partition table",
			path, d.Name, "/dev/"+filepath.Base(filepath.Dir(sys)))
	}
	d.Removable = strings.TrimSpace(readSys(filepath.Join(sys, "removable"))) == "1"
	d.ReadOnly = strings.TrimSpace(readSys(filepath.Join(sys, "ro"))) == "1"
	parts, _ := filepath.Glob(filepath.Join(sys, d.Name+"*", "partition"))
	for _, p := range parts {
		if dev := strings.TrimSpace(readSys(filepath.Join(filepath.Dir(p), "dev"))); dev != "" {
			d.devs = append(d.devs, dev)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", path, err)
	}
	defer f.Close()
	if d.Size, err = f.Seek(0, io.SeekEnd); err != nil {
		return nil, fmt.Errorf("device %s: size: %w", path, err)
	}
	return d, nil
}

func readSys(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// InUse names what holds the device or one of its partitions: a mount
// (from /proc/self/mountinfo) or a holder (dm-verity, LVM, RAID in sysfs).
func (d *Device) InUse() ([]string, error) {
	var uses []string
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer mi.Close()
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		// id parent MAJ:MIN root mountpoint …
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		for _, dev := range d.devs {
			if fs[2] == dev {
				uses = append(uses, fmt.Sprintf("%s is mounted on %s", devName(dev), fs[4]))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	holders, _ := filepath.Glob(filepath.Join(d.sys, "holders", "*"))
	more, _ := filepath.Glob(filepath.Join(d.sys, d.Name+"*", "holders", "*"))
	for _, h := range append(holders, more...) {
		uses = append(uses, fmt.Sprintf("%s is held by %s", filepath.Base(filepath.Dir(filepath.Dir(h))), filepath.Base(h)))
	}
	return uses, nil
}

// devName is the kernel name of MAJ:MIN, for messages.
func devName(majmin string) string {
	if p, err := filepath.EvalSymlinks("/sys/dev/block/" + majmin); err == nil {
		return filepath.Base(p)
	}
	return majmin
}

// Options say what Check may let through.
type Options struct {
	Force bool // write to a device that is not removable
}

// Check refuses a device the image must not be written to: in use, not
// removable (unless forced), or smaller than size bytes.
func (d *Device) Check(size int64, o Options) error {
	uses, err := d.InUse()
	if err != nil {
		return err
	}
	if len(uses) > 0 {
		return fmt.Errorf("%s is in use (%s): unmount it first (umount /dev/%s*; eject it in the desktop), then run kiln write again",
			d.Path, strings.Join(uses, "; "), d.Name)
	}
	if d.ReadOnly {
		return fmt.Errorf("%s is read-only (the stick's write-protect switch, or blockdev --setro): make it writable, then run kiln write again", d.Path)
	}
	if !d.Removable && !o.Force {
		return fmt.Errorf("%s (%s, %s) is not a removable device: it may be a disk of this host; "+
			"check with lsblk that it is the stick, then run again with --force to write to it", d.Path, d.Name, contract.Bytes(d.Size))
	}
	if size > d.Size {
		return fmt.Errorf("%s holds %s (%d bytes), the image needs %s (%d bytes): use a larger stick; nothing was written",
			d.Path, contract.Bytes(d.Size), d.Size, contract.Bytes(size), size)
	}
	return nil
}

const chunk = 4 << 20

// Write copies the image at the start of the device, flushes it, drops the
// kernel's cache of the device and reads every byte back, comparing the
// sha256 of what it read with the image's. It returns that digest.
func Write(ctx context.Context, image string, d *Device, p progress.Reporter) (string, error) {
	in, err := os.Open(image)
	if err != nil {
		return "", err
	}
	defer in.Close()
	size, err := in.Seek(0, io.SeekEnd)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", image, err)
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	// O_EXCL on a block device: the kernel refuses it while mounted or held.
	out, err := os.OpenFile(d.Path, os.O_WRONLY|unix.O_EXCL, 0)
	if err != nil {
		return "", fmt.Errorf("open %s for writing: %w (is it mounted or in use?)", d.Path, err)
	}
	defer out.Close()

	want := sha256.New()
	t := p.Task("write "+d.Path, size)
	_, err = copyCtx(ctx, io.MultiWriter(out, t), io.TeeReader(in, want))
	if err == nil {
		err = out.Sync()
	}
	if err == nil {
		err = unix.IoctlSetInt(int(out.Fd()), unix.BLKFLSBUF, 0)
	}
	t.Done(err)
	if err != nil {
		return "", fmt.Errorf("write %s: %w: the stick is incomplete; try again or use another stick", d.Path, err)
	}

	w := want.Sum(nil)
	if err := ReadBack(ctx, d.Path, size, w, p); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(w), nil
}

// ReadBack reads the first size bytes of the device and compares their
// sha256 with want.
func ReadBack(ctx context.Context, dev string, size int64, want []byte, p progress.Reporter) error {
	rd, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("read back %s: %w", dev, err)
	}
	defer rd.Close()
	got := sha256.New()
	t := p.Task("read back "+dev, size)
	n, err := copyCtx(ctx, io.MultiWriter(got, t), io.LimitReader(rd, size))
	if err == nil && n < size {
		err = fmt.Errorf("the device ended after %d bytes", n)
	}
	t.Done(err)
	if err != nil {
		return fmt.Errorf("read back %s: %w: the stick is unreliable; use another stick", dev, err)
	}
	if g := got.Sum(nil); !bytes.Equal(want, g) {
		return fmt.Errorf("read back %s: its first %d bytes have sha256 %x, the image %x: the stick did not keep what was written; use another stick",
			dev, size, g, want)
	}
	return nil
}

// copyCtx is io.Copy in chunks, stopping when ctx is done.
func copyCtx(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, chunk)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		r, err := io.ReadFull(src, buf)
		if r > 0 {
			if _, werr := dst.Write(buf[:r]); werr != nil {
				return n, werr
			}
			n += int64(r)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
