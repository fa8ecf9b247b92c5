// Package leftover names the temporary files and directories of a build
// after the process that owns them, so that a later build can remove what a
// killed build (SIGKILL, power cut) left behind — and only that.
//
// A name carries its owner's tag: the boot, the PID namespace, the PID and
// the process's start time (from /proc/PID/stat, so a reused PID is not
// mistaken for the owner):
//
//	<prefix><boot>.<pidns>.<pid>.<start>-<random>
//
// An owner is provably dead when the machine has rebooted since (another
// boot id), or, in the same PID namespace, when no process has its PID or
// the one that has it started at another time. An entry of another PID
// namespace (a build in a container sharing the directory) cannot be proved
// dead from here and is kept, as is every name without a tag.
package leftover

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// owner identifies a process across PID reuse and reboots.
type owner struct {
	boot  string // first 8 hex digits of /proc/sys/kernel/random/boot_id
	pidns string // inode of /proc/self/ns/pid
	pid   int
	start uint64 // start time, clock ticks after boot (/proc/PID/stat field 22)
}

func (o owner) tag() string {
	return fmt.Sprintf("%s.%s.%d.%d", o.boot, o.pidns, o.pid, o.start)
}

// parseTag reads a tag written by tag.
func parseTag(s string) (owner, bool) {
	f := strings.Split(s, ".")
	if len(f) != 4 || len(f[0]) != 8 || f[1] == "" {
		return owner{}, false
	}
	pid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 || strings.Trim(f[1], "0123456789") != "" {
		return owner{}, false
	}
	return owner{boot: f[0], pidns: f[1], pid: pid, start: start}, true
}

// self is this process's owner, or an error where /proc cannot tell.
var self = sync.OnceValues(func() (owner, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(boot) < 8 {
		return owner{}, fmt.Errorf("read boot id: %v", err)
	}
	ns, err := pidNamespace("self")
	if err != nil {
		return owner{}, err
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return owner{}, err
	}
	return owner{boot: string(boot[:8]), pidns: ns, pid: pid, start: start}, nil
})

func pidNamespace(proc string) (string, error) {
	link, err := os.Readlink("/proc/" + proc + "/ns/pid") // "pid:[4026531836]"
	if err != nil {
		return "", err
	}
	ino := strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]")
	if ino == link || ino == "" {
		return "", fmt.Errorf("unexpected /proc/%s/ns/pid %q", proc, link)
	}
	return ino, nil
}

// startTime reads field 22 of /proc/PID/stat. The command name (field 2)
// may hold spaces and parentheses, so fields are counted from its last ')'.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return strconv.ParseUint(f[19], 10, 64) // field 3 is f[0]
}

// Pattern returns prefix followed by this process's tag and "-", for
// os.CreateTemp and os.MkdirTemp (which add the random part). Where /proc
// cannot tell who this process is, the name has no tag and is never swept.
func Pattern(prefix string) string {
	o, err := self()
	if err != nil {
		return prefix
	}
	return prefix + o.tag() + "-"
}

// dead reports whether o is provably no longer running.
func dead(o owner) bool {
	me, err := self()
	if err != nil {
		return false
	}
	if o.boot != me.boot {
		return true // nothing survives a reboot
	}
	if o.pidns != me.pidns {
		return false // its PIDs are not ours to look up
	}
	start, err := startTime(o.pid)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && start != o.start // the PID was reused
}

// Sweep removes the entries of dir named by Pattern(prefix) whose owner is
// provably dead, and returns their paths. A build killed mid-preload can
// leave a mount under its staging tree (containers/storage probing overlay):
// mounts under a dead build's entry are unmounted first, so nothing is ever
// removed through a mount; an entry whose mount cannot be unmounted is kept
// and reported in the error.
func Sweep(dir, prefix string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look for leftovers in %s: %w", dir, err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		o, ok := ownerOf(e.Name(), prefix)
		if !ok || !dead(o) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := removeTree(p); err != nil {
			errs = append(errs, fmt.Errorf("leftover of a killed build not removed: %w", err))
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// ownerOf reads the owner's tag from a name Pattern(prefix) made.
func ownerOf(name, prefix string) (owner, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	tag, _, hasRandom := strings.Cut(rest, "-")
	if !ok || !hasRandom {
		return owner{}, false
	}
	return parseTag(tag)
}

// Tagged says whether name carries an owner's tag after prefix, as
// Pattern(prefix) names it: Sweep decides about it, nothing else should.
func Tagged(name, prefix string) bool {
	_, ok := ownerOf(name, prefix)
	return ok
}

// removeTree unmounts whatever is mounted under p, deepest first, checks
// that nothing under p is on another filesystem any more, and removes p.
func removeTree(p string) error {
	mounts, err := mountsUnder(p)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := syscall.Unmount(m, 0); err != nil {
			return fmt.Errorf("unmount %s: %w (unmount it, then remove %s)", m, err, p)
		}
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	dev := fi.Sys().(*syscall.Stat_t).Dev
	err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Sys().(*syscall.Stat_t).Dev != dev {
			return fmt.Errorf("%s is a mount point: unmount it, then remove %s", q, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.RemoveAll(p)
}

// mountsUnder lists the mount points below p (from /proc/self/mountinfo),
// deepest first.
func mountsUnder(p string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	// Field 5 is the mount point, with space, tab, newline and backslash
	// escaped in octal.
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	var ms []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			if m := unescape.Replace(f[4]); strings.HasPrefix(m, p+"/") {
				ms = append(ms, m)
			}
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(ms)))
	return ms, nil
}
