// Package filestamp says when a check of a file's bytes may be bound to the
// file's state — device, inode, size, mtime and ctime, its stamp — instead
// of being made again: on which filesystems a change of the file moves its
// stamp, and how long after its last write a stamp can be trusted. The
// factory's blob cache (a local layout's blobs, checked once per stamp) and
// the node's registry (a blob checked once per stamp before it is served
// unhashed) apply the same rule.
//
// What a stamp cannot see is a change under the filesystem, on its device
// (a bit flipped on the disk after the check): that is dm-verity's job.
package filestamp

import (
	"time"

	"golang.org/x/sys/unix"
)

// movesCtime are the filesystems (statfs f_type) on which every change of a
// file made through them moves its ctime, which no user can set back. FUSE,
// network and overlay filesystems may keep or fake ctime: a check of a file
// there holds only for the read that made it.
var movesCtime = map[int64]bool{
	unix.EXT4_SUPER_MAGIC:  true, // ext2/3/4
	unix.XFS_SUPER_MAGIC:   true,
	unix.BTRFS_SUPER_MAGIC: true,
	unix.TMPFS_MAGIC:       true,
	unix.F2FS_SUPER_MAGIC:  true,
}

// readOnly are the filesystems nothing can change a file through at all.
var readOnly = map[int64]bool{
	unix.SQUASHFS_MAGIC:       true,
	unix.EROFS_SUPER_MAGIC_V1: true,
}

// MovesCtime reports whether every change of a file on a filesystem of
// type fsType (statfs f_type) moves the file's stamp, for as long as the
// file exists: a stamp recorded today still tells tomorrow whether the file
// changed.
func MovesCtime(fsType int64) bool { return movesCtime[fsType] }

// WhileMounted reports whether a stamp taken on a filesystem of type fsType
// holds for as long as that filesystem stays mounted: MovesCtime, or a
// read-only filesystem. A read-only one is not enough for a stamp kept past
// its mount: another image mounted in its place may hold a file of the same
// inode, size and times (squashfs has no ctime of its own, its inode numbers
// are the image's).
func WhileMounted(fsType int64) bool { return movesCtime[fsType] || readOnly[fsType] }

// RacyWindow is how long a file must have been left alone before its stamp
// can be trusted: a write within the same tick of the kernel's coarse clock
// as the last one can leave mtime and ctime where they were (git's "racy"
// case). A tick is 1-10 ms (HZ 1000 to 100); the window is ten times the
// longest.
const RacyWindow = 100 * time.Millisecond
