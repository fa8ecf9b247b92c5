package registry

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/filestamp"
	"github.com/opencontainers/go-digest"
)

// A blob's bytes go out only once they were checked against its digest
// (issue 26). How a check is kept depends on where the file lies:
//
//   - on dm-verity (the image partition as the node mounts it): every block
//     read is the block the factory built, or an I/O error. The factory
//     checked every blob against its digest before it wrote it, so the
//     bytes are checked already; the first full read is still hashed on its
//     way out (a factory bug would show there), nothing after it.
//   - on a filesystem whose ctime moves with every write or that is
//     read-only (filestamp.WhileMounted: the release store on /var, a layout
//     directory on ext4, a squashfs without verity), a check is bound
//     to the file's stamp (fileStamp: device, inode, size, mtime, ctime). A
//     blob is hashed before (Range) or while (a full GET) it is first sent,
//     and again whenever its stamp moved; a checked blob is sent unhashed,
//     and its stamp is taken again before its last byte goes out.
//   - anywhere else (FUSE, network, overlay filesystems, which may keep or
//     fake ctime): hashed on every read.
//
// What a stamp cannot see is a change under the filesystem, on its device
// (a bit flipped on the disk after the check): that is what dm-verity is
// for, and the image partition has it unless the recipe turned it off.
// The checks are kept in memory, for the registry's life: a stamp on a
// read-only filesystem holds while it stays mounted.

// fileStamp is the state of a blob file a check is bound to: any write to
// it or its replacement moves its ctime, which no user can set back.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fi.Sys().(*syscall.Stat_t)
	return fileStamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// racyFor is how long the file must still be left alone before its stamp
// can be trusted (filestamp.RacyWindow).
func (st fileStamp) racyFor(now time.Time) time.Duration {
	last := max(st.mtime.Nano(), st.ctime.Nano())
	return filestamp.RacyWindow - now.Sub(time.Unix(0, last))
}

// check is what a hash of a blob file found: its stamp when it was read,
// and whether its bytes matched the digest.
type check struct {
	stamp fileStamp
	ok    bool
}

// trust is how far a blob file can be trusted between reads.
type trust int

const (
	hashEveryRead trust = iota // its ctime may not move with a write
	stamped                    // checked once per stamp
	verity                     // dm-verity: the build's bytes or an I/O error
)

// trustOf tells how far the files of a device can be trusted, learnt from
// the first file met on it (one statfs, one sysfs read) and kept.
type trustOf struct {
	sysfs string // /sys; a test's tree in tests
	mu    sync.Mutex
	devs  map[uint64]trust
}

func (t *trustOf) of(f *os.File, dev uint64) trust {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr, ok := t.devs[dev]; ok {
		return tr
	}
	tr := hashEveryRead
	var fs unix.Statfs_t
	switch {
	case t.onVerity(dev):
		tr = verity
	case unix.Fstatfs(int(f.Fd()), &fs) == nil && filestamp.WhileMounted(int64(fs.Type)):
		tr = stamped
	}
	if t.devs == nil {
		t.devs = map[uint64]trust{}
	}
	t.devs[dev] = tr
	return tr
}

// onVerity reports whether dev is a dm-verity device opened by veritysetup,
// as the node's kiln-images-verity.service opens the image partition: its
// device-mapper UUID is "CRYPT-VERITY-…" (cryptsetup's naming; sysfs shows
// it to any user). A filesystem on it reads only the blocks the root hash
// vouches for. Anything else, including a device-mapper device of another
// kind, is not.
func (t *trustOf) onVerity(dev uint64) bool {
	uuid, err := os.ReadFile(filepath.Join(t.sysfs, "dev", "block", fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev)), "dm", "uuid"))
	return err == nil && strings.HasPrefix(string(uuid), "CRYPT-VERITY-")
}

// hashFile returns whether the size bytes of f match want, reading f
// from its start (ReadAt: its offset is left alone).
func hashFile(f *os.File, size int64, want string) (bool, error) {
	h := sha256.New()
	bp := getSendBuffer()
	defer putSendBuffer(bp)
	n, err := io.CopyBuffer(h, io.NewSectionReader(f, 0, size), *bp)
	if err != nil {
		return false, err
	}
	return n == size && digest.NewDigest(digest.SHA256, h).String() == want, nil
}
