package preload

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// normalize makes the store at dir reproducible and host-independent, once
// containers/storage is done with it. Every source of nondeterminism found
// by building twice and diffing the trees is handled here:
//
//   - overlay/<layer>/link and overlay/l/<id>: the overlay driver names each
//     layer's short link with 26 random characters; they become a hash of the
//     layer ID, and the children's "lower" files are rewritten to match.
//   - *.lock: containers/storage writes a random "last writer" token into
//     lock files; an empty lock file is the valid initial state.
//   - overlay-layers/layers.json "created": the wall clock; set to created.
//   - overlay-images/images.json "created": the image config's, or the wall
//     clock when the config has none; the latter is set to created.
//   - mtimes: metadata files and directories the build creates carry the
//     wall clock, as do whiteout devices and directories the layer tar does
//     not list; every mtime newer than the build's start is clamped to
//     created (the SOURCE_DATE_EPOCH rule). Timestamps from the layers are
//     kept.
//
// Layer IDs are chain IDs and image IDs config digests; tar-split files are
// gzip without a header timestamp; JSON metadata is written in a fixed
// order.
func normalize(dir string, start, created time.Time) error {
	ov := filepath.Join(dir, Driver)
	if err := relink(ov); err != nil {
		return err
	}
	locks, err := filepath.Glob(filepath.Join(dir, "*.lock"))
	if err != nil {
		return err
	}
	more, _ := filepath.Glob(filepath.Join(dir, "*", "*.lock"))
	for _, l := range append(locks, more...) {
		if err := os.Truncate(l, 0); err != nil {
			return err
		}
	}
	if err := rewriteCreated(filepath.Join(dir, Driver+"-layers", "layers.json"), created, time.Time{}); err != nil {
		return err
	}
	// An image's "created" is its config's, unless the config has none:
	// then c/image records the wall clock.
	if err := rewriteCreated(filepath.Join(dir, Driver+"-images", "images.json"), created, start.Add(-time.Second)); err != nil {
		return err
	}
	return clampTimes(dir, start, created)
}

// linkID is the short link name of a layer: stable, 26 characters of the
// overlay driver's alphabet (base32), so lower-dir mount options stay as
// short as the driver intends.
func linkID(layer string) string {
	sum := sha256.Sum256([]byte("kiln overlay link " + layer))
	return base32.StdEncoding.EncodeToString(sum[:])[:26]
}

// relink replaces the random short links under ov (the overlay driver home).
func relink(ov string) error {
	ents, err := os.ReadDir(ov)
	if err != nil {
		return err
	}
	rename := map[string]string{} // "l/OLD" -> "l/NEW"
	var layers []string
	for _, e := range ents {
		linkFile := filepath.Join(ov, e.Name(), "link")
		old, err := os.ReadFile(linkFile)
		if err != nil {
			continue // not a layer directory (l, tempdirs, flag files)
		}
		layers = append(layers, e.Name())
		id := linkID(e.Name())
		rename["l/"+string(old)] = "l/" + id
		if err := os.Remove(filepath.Join(ov, "l", string(old))); err != nil {
			return fmt.Errorf("layer %s: %w", e.Name(), err)
		}
		if err := os.Symlink(filepath.Join("..", e.Name(), "diff"), filepath.Join(ov, "l", id)); err != nil {
			return fmt.Errorf("layer %s: %w", e.Name(), err)
		}
		if err := os.WriteFile(linkFile, []byte(id), 0o644); err != nil {
			return err
		}
	}
	for _, layer := range layers {
		lowerFile := filepath.Join(ov, layer, "lower")
		lower, err := os.ReadFile(lowerFile)
		if os.IsNotExist(err) {
			continue // base layer
		} else if err != nil {
			return err
		}
		parts := strings.Split(string(lower), ":")
		for i, p := range parts {
			n, ok := rename[p]
			if !ok {
				return fmt.Errorf("layer %s: lower entry %q names no layer of this store", layer, p)
			}
			parts[i] = n
		}
		if err := os.WriteFile(lowerFile, []byte(strings.Join(parts, ":")), 0o644); err != nil {
			return err
		}
	}
	// Nothing else may remain in l/: an unknown entry would be host state.
	ls, err := os.ReadDir(filepath.Join(ov, "l"))
	if err != nil {
		return err
	}
	if len(ls) != len(layers) {
		return fmt.Errorf("%s/l holds %d links for %d layers", ov, len(ls), len(layers))
	}
	return nil
}

// rewriteCreated sets the "created" field of the records in a
// containers/storage JSON array file to created, where it is after
// (zero: every record), keeping every other field as written.
func rewriteCreated(path string, created, after time.Time) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var recs []map[string]json.RawMessage
	if err := json.Unmarshal(b, &recs); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	ts, _ := json.Marshal(created.UTC())
	for _, r := range recs {
		raw, ok := r["created"]
		if !ok {
			continue
		}
		var t time.Time
		if err := json.Unmarshal(raw, &t); err != nil {
			return fmt.Errorf("parse %s: created: %w", path, err)
		}
		if after.IsZero() || t.After(after) {
			r["created"] = ts
		}
	}
	out, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	if bytes.Equal(out, b) {
		return nil
	}
	tmp := path + ".kiln-tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// clampTimes sets every mtime (and atime) newer than start to t, without
// following symlinks.
func clampTimes(dir string, start, t time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	limit := start.Add(-time.Second) // filesystems with coarse timestamps
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.ModTime().Before(limit) {
			return nil
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("set time of %s: %w", p, err)
		}
		return nil
	})
}
