// Package stickwrite writes a disk or stick image onto a whole block device on
// the factory host (`kiln write`) and proves it by reading every byte back.
// It refuses, before writing anything, devices that are not whole disks,
// are in use, are not removable (unless forced) or are too small.
package stickwrite

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/blockdev"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/opencontainers/go-digest"
)

// Device is a whole block device as sysfs describes it.
type Device struct{ *blockdev.Device }

// Open describes the block device at path, refusing anything else.
func Open(path string) (*Device, error) {
	d, err := blockdev.Open(path)
	if err != nil {
		return nil, err
	}
	return &Device{d}, nil
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
			"check with lsblk that it is the stick, then run again with --force to write to it", d.Path, d.Name, human.Bytes(d.Size))
	}
	if size > d.Size {
		return fmt.Errorf("%s holds %s (%d bytes), the image needs %s (%d bytes): use a larger stick; nothing was written",
			d.Path, human.Bytes(d.Size), d.Size, human.Bytes(size), size)
	}
	return nil
}

// Write copies the image at the start of the device, flushes it, drops the
// kernel's cache of the device and reads every byte back, comparing the
// sha256 of what it read with the image's. It returns that digest.
func Write(ctx context.Context, image string, d *Device, p progress.Reporter) (string, error) {
	in, err := inputfile.OpenFile(image)
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
	_, err = blockdev.Copy(ctx, io.MultiWriter(out, t), io.TeeReader(in, want))
	if err == nil {
		err = blockdev.Flush(out)
	}
	t.Done(err)
	if err != nil {
		return "", fmt.Errorf("write %s: %w: the stick is incomplete; try again or use another stick", d.Path, err)
	}

	w := want.Sum(nil)
	if err := blockdev.ReadBack(ctx, d.Path, size, w, p); err != nil {
		return "", err
	}
	return digest.NewDigestFromBytes(digest.SHA256, w).String(), nil
}
