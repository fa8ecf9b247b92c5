// Package blockdev describes whole block devices as sysfs does and writes,
// flushes and reads them back. Both sides use it: the factory's `kiln write`
// (builder/stickwrite) and the node's `kiln agent reflash`, which may not import
// the factory's packages.
package blockdev

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/human"
)

// Device is a whole block device as sysfs describes it.
type Device struct {
	Path      string // as given
	Name      string // kernel name, e.g. sdb, loop3
	Size      int64
	Removable bool
	ReadOnly  bool
	Model     string // device/model, "" when the device has none (loop, virtio)
	Serial    string // device/serial or serial, "" when unknown
	MajMin    string
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
	d := &Device{Path: path, Name: filepath.Base(sys), MajMin: majmin, sys: sys, devs: []string{majmin}}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		return nil, fmt.Errorf("%s is partition %s of a disk: give the whole device (%s), the image carries its own partition table",
			path, d.Name, "/dev/"+filepath.Base(filepath.Dir(sys)))
	}
	d.Removable = readSys(sys, "removable") == "1"
	d.ReadOnly = readSys(sys, "ro") == "1"
	d.Model = readSys(sys, "device/model")
	if d.Serial = readSys(sys, "device/serial"); d.Serial == "" {
		d.Serial = readSys(sys, "serial") // virtio-blk
	}
	parts, _ := filepath.Glob(filepath.Join(sys, d.Name+"*", "partition"))
	for _, p := range parts {
		if dev := readSys(filepath.Dir(p), "dev"); dev != "" {
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

// String names the device for a person choosing it: path, model, serial, size.
func (d *Device) String() string {
	model, serial := d.Model, d.Serial
	if model == "" {
		model = "no model"
	}
	if serial == "" {
		serial = "no serial"
	}
	return fmt.Sprintf("%s (%s, serial %s, %s)", d.Path, model, serial, human.Bytes(d.Size))
}

func readSys(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return strings.TrimSpace(string(b))
}

// InUse names what holds the device or one of its partitions: a mount
// (from /proc/self/mountinfo) or a holder (dm-verity, LVM, RAID in sysfs).
func (d *Device) InUse() ([]string, error) {
	var uses []string
	mounts, err := Mounts()
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		for _, dev := range d.devs {
			if m.MajMin == dev {
				uses = append(uses, fmt.Sprintf("%s is mounted on %s", devName(dev), m.Point))
			}
		}
	}
	holders, _ := filepath.Glob(filepath.Join(d.sys, "holders", "*"))
	more, _ := filepath.Glob(filepath.Join(d.sys, d.Name+"*", "holders", "*"))
	for _, h := range append(holders, more...) {
		uses = append(uses, fmt.Sprintf("%s is held by %s", filepath.Base(filepath.Dir(filepath.Dir(h))), filepath.Base(h)))
	}
	return uses, nil
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	MajMin string // of the mounted device (0:N for filesystems without one)
	Point  string
}

// Mounts lists this process's mounts.
func Mounts() ([]Mount, error) {
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer mi.Close()
	var ms []Mount
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		// id parent MAJ:MIN root mountpoint …
		fs := strings.Fields(sc.Text())
		if len(fs) >= 5 {
			ms = append(ms, Mount{MajMin: fs[2], Point: unescape(fs[4])})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	return ms, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// devName is the kernel name of MAJ:MIN, for messages.
func devName(majmin string) string {
	if p, err := filepath.EvalSymlinks("/sys/dev/block/" + majmin); err == nil {
		return filepath.Base(p)
	}
	return majmin
}

// Disks are the whole disks that back the block device MAJ:MIN: its disk
// when it is a partition, and, through device-mapper or RAID (slaves), the
// disks below it. sysfs is the sysfs root ("/sys" on a real system).
func Disks(sysfs, majmin string) []string {
	p, err := filepath.EvalSymlinks(filepath.Join(sysfs, "dev/block", majmin))
	if err != nil {
		return nil
	}
	return disksOf(p, 0)
}

func disksOf(sys string, depth int) []string {
	if depth > 8 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		sys = filepath.Dir(sys)
	}
	slaves, _ := filepath.Glob(filepath.Join(sys, "slaves", "*"))
	if len(slaves) == 0 {
		return []string{filepath.Base(sys)}
	}
	var out []string
	for _, s := range slaves {
		if r, err := filepath.EvalSymlinks(s); err == nil {
			out = append(out, disksOf(r, depth+1)...)
		}
	}
	return out
}
