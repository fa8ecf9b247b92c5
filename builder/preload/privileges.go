package preload

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// CheckPrivileges tries, in a scratch directory under dir, each thing
// unpacking overlay layers needs, and names every one that fails. dir should
// be on the filesystem the store will be staged on.
func CheckPrivileges(dir string) error {
	tmp, err := os.MkdirTemp(dir, ".kiln-privcheck-")
	if err != nil {
		return fmt.Errorf("preload: cannot write in %s: %w", dir, err)
	}
	defer os.RemoveAll(tmp)

	var missing []string
	probe := func(what string, f func() error) {
		if err := f(); err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the scratch path says nothing useful
			}
			missing = append(missing, fmt.Sprintf("%s (%v)", what, err))
		}
	}
	file := filepath.Join(tmp, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		return fmt.Errorf("preload: cannot write in %s: %w", dir, err)
	}
	// Linux >= 5.8 lets anyone create a 0:0 whiteout; older kernels need CAP_MKNOD.
	probe("mknod of whiteout devices (CAP_MKNOD)", func() error {
		return unix.Mknod(filepath.Join(tmp, "wh"), unix.S_IFCHR, 0)
	})
	probe("trusted.* xattrs for opaque directories (CAP_SYS_ADMIN)", func() error {
		return unix.Setxattr(tmp, "trusted.overlay.opaque", []byte("y"), 0)
	})
	probe("chown to any owner (CAP_CHOWN)", func() error {
		return os.Lchown(file, 1000, 1000)
	})
	probe("file capabilities, security.capability (CAP_SETFCAP)", func() error {
		v := []byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		return unix.Setxattr(file, "security.capability", v, 0)
	})
	probe("chroot for layer unpacking (CAP_SYS_CHROOT)", func() error {
		// Probing chroot would change this process's root; a capability
		// read is enough.
		return hasCap(unix.CAP_SYS_CHROOT)
	})
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("preload: this build host cannot unpack container layers into %s: missing %s; run kiln build as root, or in a privileged container (podman run --privileged), on a filesystem with trusted.* xattr support such as ext4 or xfs",
		dir, strings.Join(missing, ", "))
}

// hasCap reports whether the process has capability c in its effective set.
func hasCap(c int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	if data[c/32].Effective&(1<<(uint(c)%32)) == 0 {
		return errors.New("not in the effective capability set")
	}
	return nil
}
