package filestamp

import (
	"testing"

	"golang.org/x/sys/unix"
)

// A read-only filesystem holds a stamp while it is mounted, never past it
// (the factory's cache keeps stamps across builds); a filesystem that may
// keep or fake ctime holds none.
func TestWhichFilesystems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		fsType              int64
		moves, whileMounted bool
	}{
		{"ext4", unix.EXT4_SUPER_MAGIC, true, true},
		{"xfs", unix.XFS_SUPER_MAGIC, true, true},
		{"tmpfs", unix.TMPFS_MAGIC, true, true},
		{"squashfs", unix.SQUASHFS_MAGIC, false, true},
		{"erofs", unix.EROFS_SUPER_MAGIC_V1, false, true},
		{"fuse", unix.FUSE_SUPER_MAGIC, false, false},
		{"nfs", unix.NFS_SUPER_MAGIC, false, false},
		{"overlay", unix.OVERLAYFS_SUPER_MAGIC, false, false},
	} {
		if got := MovesCtime(tc.fsType); got != tc.moves {
			t.Errorf("MovesCtime(%s) = %v", tc.name, got)
		}
		if got := WhileMounted(tc.fsType); got != tc.whileMounted {
			t.Errorf("WhileMounted(%s) = %v", tc.name, got)
		}
	}
}
