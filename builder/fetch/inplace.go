package fetch

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/builder/internal/leftover"
	"github.com/kiln-appliance/kiln/internal/inputfile"
)

// inPlace reports whether blob d of a local OCI layout can be used where it
// is (Request.InPlace), and its path. It can when a hard link to it from the
// cache directory is possible (same filesystem) and would put the same
// bytes on the image partition as a cached copy: a readable regular file of
// the right size with the extended attributes a blob written into the cache
// gets (mksquashfs records them). Mode and owner may differ: the packer sets
// those of a cached copy (NewBlobOwner) on the partition instead.
func (c *Cache) inPlace(src source, d v1.Descriptor) (string, bool) {
	if src.Transport != TransportOCI {
		return "", false
	}
	want, err := c.newBlobLooks()
	if err != nil {
		return "", false
	}
	p := filepath.Join(src.Path, "blobs", d.Digest.Algorithm, d.Digest.Hex)
	got, err := looksOf(p)
	if err != nil || got.mode&unix.S_IFMT != unix.S_IFREG || got.size != d.Size || got.dev != want.dev || !slices.Equal(got.xattrs, want.xattrs) {
		return "", false
	}
	if inputfile.Check(p) != nil {
		return "", false
	}
	return p, true
}

// NewBlobOwner is the owner and group of a blob written into the cache: an
// in-place blob is packed with them, so the disk is the same either way.
func (c *Cache) NewBlobOwner() (uid, gid uint32, err error) {
	l, err := c.newBlobLooks()
	return l.uid, l.gid, err
}

// looks is what mksquashfs records of a file besides its bytes and times
// (SOURCE_DATE_EPOCH sets every time), and where the file is.
type looks struct {
	dev, size int64
	mode      uint32 // type and permission bits
	uid, gid  uint32
	xattrs    []string // name=value, sorted
}

func looksOf(path string) (looks, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return looks{}, err
	}
	l := looks{dev: int64(st.Dev), size: st.Size, mode: st.Mode, uid: st.Uid, gid: st.Gid}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return l, nil
	}
	names := make([]byte, 64<<10)
	n, err := unix.Llistxattr(path, names)
	if err != nil && err != unix.ENOTSUP {
		return looks{}, err
	}
	for _, name := range bytes.Split(names[:max(n, 0)], []byte{0}) {
		if len(name) == 0 {
			continue
		}
		val := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(path, string(name), val)
		if err != nil {
			return looks{}, err
		}
		l.xattrs = append(l.xattrs, string(name)+"="+string(val[:m]))
	}
	sort.Strings(l.xattrs)
	return l, nil
}

// newBlobLooks is how a blob written into this cache looks: a probe file
// created and chmodded as write does it, once per Cache.
func (c *Cache) newBlobLooks() (looks, error) {
	c.probeOnce.Do(func() {
		f, err := os.CreateTemp(filepath.Join(c.dir, "blobs", "sha256"), leftover.Pattern(tempPrefix))
		if err != nil {
			c.probeErr = err
			return
		}
		defer os.Remove(f.Name())
		defer f.Close()
		if c.probeErr = f.Chmod(0o644); c.probeErr != nil {
			return
		}
		c.probe, c.probeErr = looksOf(f.Name())
	})
	return c.probe, c.probeErr
}

// probeState is the cached result of newBlobLooks.
type probeState struct {
	probeOnce sync.Once
	probe     looks
	probeErr  error
}
