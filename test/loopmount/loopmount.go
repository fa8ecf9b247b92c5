// Package loopmount lets a test read what kiln wrote with the kernel itself:
// a squashfs byte range of an image file, attached read-only through a loop
// device over exactly that range (containers have no udev for -P partition
// nodes) and mounted read-only. Both are undone when the test ends.
package loopmount

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// Squashfs mounts the squashfs at offset (size bytes) of img and returns
// the mount point.
func Squashfs(t testing.TB, img string, offset, size int64) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", "--read-only",
		"--offset", fmt.Sprint(offset), "--sizelimit", fmt.Sprint(size), img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup %s at %d: %v\n%s", img, offset, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "squashfs", "-o", "ro,nodev,nosuid,noexec", dev, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s (%s at %d): %v\n%s", dev, img, offset, err, out)
	}
	// Registered after the detach, so it runs before it.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}
