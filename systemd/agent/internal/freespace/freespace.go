// Package freespace says how much the node's agent may still write on a
// filesystem: the import's release store on /var, the OS install's ESP.
package freespace

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Available is what an unprivileged writer may still use on dir's
// filesystem (f_bavail: the blocks reserved for root are not counted, so
// a check against it holds whoever writes).
func Available(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space on %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}
