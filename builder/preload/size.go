package preload

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
)

// StoreSize is the disk usage of the tree at dir: allocated blocks of every
// file, directory and symlink, each hard-linked inode counted once.
func StoreSize(dir string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			total += info.Size()
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("size of store %s: %w", dir, err)
	}
	return total, nil
}
