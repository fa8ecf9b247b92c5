package regindex

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Manifest is one manifest or index as a walk finds it: read and checked
// against its digest, with what it references.
type Manifest struct {
	Digest       string
	MediaType    string // the manifest's own mediaType, else its descriptor's
	Size         int64
	Data         []byte
	ArtifactType string            // for referrers: artifactType, or the config media type
	Annotations  map[string]string // for referrers
	Subject      string            // digest of the manifest it refers to, if any
	Children     []string          // child manifests (index)
	Blobs        []string          // config and layers (image manifest)
}

// Blob is where a walk found one blob and the size its descriptors promise.
// An empty Path is a blob no place of its source holds (Missing says where
// it was looked for).
type Blob struct {
	Path    string
	Size    int64
	Store   bool // in the release store (damage means: roll back, import again)
	Missing string
}

// Sink holds what walks find. The first source to give a digest wins it:
// a walk neither reads a manifest nor lstats a blob the sink holds already.
type Sink interface {
	HasManifest(digest string) bool
	HasBlob(digest string) bool
	// AddManifest is called once the manifest's children and blobs are
	// walked (by value: the walk allocates none, the sink its own).
	AddManifest(m Manifest)
	AddBlob(digest string, b Blob)
	// AddName names manifest digest in repo, under tag if set (empty for an
	// image named by digest); where names the layout entry, for log lines.
	AddName(repo, tag, digest, where string)
}

// Walker indexes OCI layouts (and, on the node, release images) as the
// node's registry serves them, into Sink. Damaged counts the blobs it found
// missing, of the wrong size or not regular files; each is logged.
type Walker struct {
	Sink    Sink
	Log     *slog.Logger
	Damaged int
}

// Source says where the blob files of one source of images live.
type Source struct {
	Store  string          // the release store's blobs/sha256 directory, "" for none
	Stored map[string]bool // digests a served release keeps in the store
	Dirs   []string        // layouts' blobs/sha256 directories, in order
}

// LayoutSource is the blob source of the OCI layout at root: its own
// blobs only.
func LayoutSource(root string) Source {
	return Source{Dirs: []string{filepath.Join(root, ocispec.ImageBlobsDir, "sha256")}}
}

// locate returns the file holding blob digest (sha256, checked by the
// caller), its lstat, and whether it is in the release store. The store is
// looked in only for digests a served release lists, so no other file there
// is ever served; then the layouts, in order. A layout source always answers
// its own path (a missing file there is a damaged partition, reported as
// such, with the lstat error); a release source answers "" when no place
// has the blob.
func (b Source) locate(digest string) (path string, store bool, fi os.FileInfo, err error) {
	hex := strings.TrimPrefix(digest, "sha256:")
	if b.Stored == nil && len(b.Dirs) == 1 {
		path = filepath.Join(b.Dirs[0], hex)
		fi, err = os.Lstat(path)
		return path, false, fi, err
	}
	if b.Store != "" && b.Stored[digest] {
		p := filepath.Join(b.Store, hex)
		if fi, err := os.Lstat(p); err == nil {
			return p, true, fi, nil
		}
	}
	for _, d := range b.Dirs {
		p := filepath.Join(d, hex)
		if fi, err := os.Lstat(p); err == nil {
			return p, false, fi, nil
		}
	}
	return "", false, nil, os.ErrNotExist
}

// nowhere says where a blob locate could not find was looked for.
func (b Source) nowhere() string {
	if b.Stored == nil {
		return "not in the layout"
	}
	return "neither in the release store nor on the image partition"
}

// rawManifest is what the registry reads of a manifest or an index
// (Docker's schema 2 types have the same shape): an image manifest plus an
// index's manifests.
type rawManifest struct {
	ocispec.Manifest
	Manifests []ocispec.Descriptor `json:"manifests"`
}

// Layout walks the OCI layout at root: every manifest index.json names is
// read and verified, every blob lstat'ed, every entry with a full reference
// named. An entry without a name is served only as a referrer of a named
// image; an entry with a bare tag or a malformed name is skipped with a
// warning. A missing or damaged top-level manifest is an error.
func (w *Walker) Layout(root string) error {
	src := LayoutSource(root)
	f, err := inputfile.OpenFile(filepath.Join(root, ocispec.ImageIndexFile), inputfile.NoFollow())
	if err != nil {
		return fmt.Errorf("read OCI layout %s: %w", root, err)
	}
	defer f.Close()
	if err := inputfile.CheckSize(f, contract.MaxManifestSize); err != nil {
		return fmt.Errorf("%w: an index.json this large is not served (on an image partition: damaged, verify it with `kiln verify`; "+
			"a layout of your own: split its images across several layouts, kiln serve takes several directories)", err)
	}
	var idx ocispec.Index
	if err := json.NewDecoder(io.LimitReader(f, contract.MaxManifestSize)).Decode(&idx); err != nil {
		return fmt.Errorf("%s/index.json: %w (file damaged? verify the partition with `kiln verify`)", root, err)
	}
	for i, d := range idx.Manifests {
		where := fmt.Sprintf("%s/index.json manifests[%d]", root, i)
		if !ValidDigest(d.Digest.String()) {
			w.Log.Warn("skipping index entry: digest is not sha256", "entry", where, "digest", d.Digest)
			continue
		}
		if err := w.Manifest(src, d, where); err != nil {
			return fmt.Errorf("%w (the layout is damaged: verify the image partition with `kiln verify` or reflash it)", err)
		}
		refName, ok := d.Annotations[ocispec.AnnotationRefName]
		if !ok {
			continue // unnamed: served only as a referrer of a named image
		}
		repo, tag, digest, err := ParseName(refName)
		if err != nil {
			w.Log.Warn("skipping index entry: ref.name is not a full image reference; rebuild the layout with names like quay.io/acme/app:1.2",
				"entry", where, "error", err)
			continue
		}
		if digest != "" && digest != d.Digest.String() {
			w.Log.Warn("skipping index entry: ref.name digest differs from the entry's digest", "entry", where, "refName", refName)
			continue
		}
		w.Sink.AddName(repo, tag, d.Digest.String(), where)
	}
	return nil
}

// Manifest reads, verifies and records the manifest d from src and, for an
// index, its children. A missing top-level manifest is an error wrapping
// os.ErrNotExist (the layout is damaged); a missing child is a warning (a
// layout may hold one platform of a multi-platform image). A negative
// d.Size is unknown (a release names its manifests by digest only).
func (w *Walker) Manifest(src Source, d ocispec.Descriptor, where string) error {
	if w.Sink.HasManifest(d.Digest.String()) {
		return nil
	}
	path, store, fi, lerr := src.locate(d.Digest.String())
	if path == "" {
		return fmt.Errorf("%s: manifest %s is %s: %w", where, d.Digest, src.nowhere(), os.ErrNotExist)
	}
	data, err := ReadVerified(path, d)
	if err != nil {
		return fmt.Errorf("%s: manifest %s: %w", where, d.Digest, err)
	}
	d.Size = int64(len(data)) // a release names a manifest by digest only
	var raw rawManifest
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("%s: manifest %s (%s) is not JSON: %w", where, d.Digest, path, err)
	}
	// Content-Type is the manifest's own mediaType when it has one (clients
	// reject a response whose Content-Type differs from it), else the
	// descriptor's.
	m := Manifest{Digest: d.Digest.String(), MediaType: raw.MediaType, Size: d.Size, Data: data, Annotations: raw.Annotations, ArtifactType: raw.ArtifactType}
	if m.MediaType == "" {
		m.MediaType = d.MediaType
	}
	if m.MediaType == "" {
		return fmt.Errorf("%s: manifest %s has no media type", where, d.Digest)
	}
	if raw.Subject != nil && ValidDigest(raw.Subject.Digest.String()) {
		m.Subject = raw.Subject.Digest.String()
	}
	hasConfig := raw.Config.Digest != ""
	if hasConfig && m.ArtifactType == "" {
		m.ArtifactType = raw.Config.MediaType
	}
	w.recordBlob(src, d, where, path, store, fi, lerr) // manifests are blobs too; located above
	for _, c := range raw.Manifests {
		if !ValidDigest(c.Digest.String()) {
			continue
		}
		err := w.Manifest(src, c, where+" → "+d.Digest.String())
		if errors.Is(err, os.ErrNotExist) {
			w.Log.Warn("index references a manifest not in the layout; that platform is not served", "entry", where, "manifest", c.Digest)
			continue
		}
		if err != nil {
			return err
		}
		m.Children = append(m.Children, c.Digest.String())
	}
	var blobs []ocispec.Descriptor
	if hasConfig {
		blobs = append(blobs, raw.Config)
	}
	blobs = append(blobs, raw.Layers...)
	for _, b := range blobs {
		if !ValidDigest(b.Digest.String()) {
			w.Log.Warn("manifest references a non-sha256 blob; it is not served", "manifest", d.Digest, "blob", b.Digest)
			continue
		}
		w.addBlob(src, b, where)
		m.Blobs = append(m.Blobs, b.Digest.String())
	}
	w.Sink.AddManifest(m)
	return nil
}

// addBlob records where blob d lives. The first source holding it wins.
// Its file is lstat'ed, never read: damage is logged now and reported to
// clients when they ask for it.
func (w *Walker) addBlob(src Source, d ocispec.Descriptor, where string) {
	if w.Sink.HasBlob(d.Digest.String()) {
		return
	}
	path, store, fi, err := src.locate(d.Digest.String())
	w.recordBlob(src, d, where, path, store, fi, err)
}

// recordBlob records blob d where locate found it (path, store, its lstat
// fi or the lstat's error), unless a source before already holds it.
func (w *Walker) recordBlob(src Source, d ocispec.Descriptor, where, path string, store bool, fi os.FileInfo, err error) {
	if w.Sink.HasBlob(d.Digest.String()) {
		return
	}
	w.Sink.AddBlob(d.Digest.String(), Blob{Path: path, Size: d.Size, Store: store, Missing: src.nowhere()})
	if path == "" {
		w.Damaged++
		w.Log.Error("blob is "+src.nowhere()+": it is not served (404); roll the release back (kiln agent release rollback VERSION) and plug its stick in again",
			"digest", d.Digest, "entry", where)
		return
	}
	fix := DamageFix(store)
	switch {
	case err != nil:
		w.Damaged++
		w.Log.Error("blob file missing: "+fix, "file", path, "entry", where, "error", err)
	case !fi.Mode().IsRegular():
		w.Damaged++
		w.Log.Error("blob file is not a regular file (a symlink?): it is never served; "+fix,
			"file", path, "entry", where, "type", fi.Mode().Type().String())
	case fi.Size() != d.Size:
		w.Damaged++
		w.Log.Error("blob file has the wrong size: "+fix, "file", path, "entry", where, "size", fi.Size(), "want", d.Size)
	}
}

// DamageFix is what a technician does about a damaged blob file of the
// release store (store) or of the image partition.
func DamageFix(store bool) string {
	if store {
		return "the release store on /var is damaged; roll the release back (kiln agent release rollback VERSION) and plug its stick in again"
	}
	return "the image partition is damaged; verify it with `kiln verify` or reflash it"
}

// ReadVerified reads a manifest file, checking its size and digest. A
// negative d.Size is unknown (a release names its manifests by digest
// only): the file may be up to contract.MaxManifestSize.
func ReadVerified(path string, d ocispec.Descriptor) ([]byte, error) {
	const maxSize = contract.MaxManifestSize
	if d.Size > maxSize {
		return nil, fmt.Errorf("size %d is over the %d byte manifest limit", d.Size, maxSize)
	}
	limit := d.Size
	if limit < 0 {
		limit = maxSize
	}
	data, err := inputfile.ReadFile(path, limit, inputfile.NoFollow())
	var tooLarge *inputfile.TooLargeError
	switch {
	case errors.As(err, &tooLarge) && tooLarge.Size > maxSize && limit >= maxSize:
		return nil, fmt.Errorf("%s is over the limit of %d bytes (%s) for a manifest", path, int64(maxSize), human.Bytes(maxSize))
	case errors.As(err, &tooLarge): // longer than its descriptor says
		return nil, fmt.Errorf("%s does not match its digest", path)
	case err != nil:
		return nil, err
	}
	if (d.Size >= 0 && int64(len(data)) != d.Size) || digest.FromBytes(data) != d.Digest {
		return nil, fmt.Errorf("%s does not match its digest", path)
	}
	return data, nil
}
