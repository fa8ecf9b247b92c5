package fetch

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/builder/internal/leftover"
	"github.com/kiln-appliance/kiln/internal/filestamp"
)

// A build packs a local oci: layout's blobs from where they lie and checks
// them as written (builder/inplace.go): a sha256 pass over every byte. The
// cache remembers which source files such a check found whole, by a stamp
// of the file's state, so a rebuild from an unchanged layout hashes only
// what changed, as a rebuild from the cache does. A stamp is only as good
// as "the file was not written since": any write or replacement changes its
// ctime, which no user can set back; a file changed within the clock's
// granularity of being stamped is never recorded (filestamp.RacyWindow), nor
// a file on a filesystem that may not move ctime (filestamp.MovesCtime; a
// read-only one is not enough: the record outlives the mount).

// Stamp is a source file's state: device, inode, size, and the times any
// write or replacement moves.
type Stamp struct {
	Path  string `json:"path"`
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtimeNs"`
	Ctime int64  `json:"ctimeNs"`
	taken time.Time
	local bool // on a filesystem known to move ctime on every write (filestamp.MovesCtime)
}

// StampOf stamps the file at path (following a symlink, as a reader's open
// does).
func StampOf(path string) (Stamp, error) {
	now := time.Now()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return Stamp{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	var fs unix.Statfs_t
	local := unix.Statfs(path, &fs) == nil && filestamp.MovesCtime(int64(fs.Type))
	return Stamp{Path: path, Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), taken: now, local: local}, nil
}

// Same reports whether s and o are one file in one state.
func (s Stamp) Same(o Stamp) bool { return s.SameContent(o) && s.Ctime == o.Ctime }

// SameContent is Same without the ctime, which linking the file elsewhere
// (as staging does) moves too: for comparing a file with itself within a
// build.
func (s Stamp) SameContent(o Stamp) bool {
	return s.Path == o.Path && s.Dev == o.Dev && s.Ino == o.Ino && s.Size == o.Size && s.Mtime == o.Mtime
}

func (c *Cache) checkedPath(h v1.Hash) string {
	return filepath.Join(c.dir, "checked", h.Algorithm, h.Hex)
}

// Checked reports whether an earlier build found the file s stamps to hold
// blob d's bytes, and the file is in the same state now.
func (c *Cache) Checked(d v1.Descriptor, s Stamp) bool {
	data, err := os.ReadFile(c.checkedPath(d.Digest))
	if err != nil {
		return false
	}
	var rec Stamp
	if json.Unmarshal(data, &rec) != nil {
		return false
	}
	return s.local && s.Size == d.Size && rec.Same(s)
}

// RecordChecked notes that the file s stamps holds blob d's bytes: the
// caller hashed them, its stamps before that and now (s) have the same
// content, and nothing of the build will touch the file again (the next
// build compares its ctime too). A stamp taken too soon after the file's
// last write is not recorded.
func (c *Cache) RecordChecked(d v1.Descriptor, s Stamp) error {
	if !s.local || s.Size != d.Size || s.taken.Sub(time.Unix(0, s.Mtime)) < filestamp.RacyWindow {
		return nil
	}
	dir := filepath.Dir(c.checkedPath(d.Digest))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, leftover.Pattern(tempPrefix))
	if err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("blob cache: %w", err)
	}
	// No fsync: a record lost or torn by a power cut is read as absent, and
	// the blob is hashed again.
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), c.checkedPath(d.Digest)); err != nil {
		return fmt.Errorf("blob cache: %w", err)
	}
	return nil
}
