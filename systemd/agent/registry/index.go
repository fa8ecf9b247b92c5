package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// maxManifestSize bounds a manifest read at start; the factory refuses to
// fetch anything larger, so a kiln-built partition never trips it.
const maxManifestSize = contract.MaxManifestSize

// blobFile is where one blob lives on disk and the size its descriptors
// promise. Paths come only from the layout walk and the release state,
// never from a request. An empty path is a blob a release needs that is
// neither in the release store nor in a layout (answered 404, logged).
type blobFile struct {
	path    string
	size    int64
	store   bool   // in the release store (damage means: roll back, import again)
	inDir   bool   // path is the layout's blobs/sha256/ directory (a prebuilt index): see blob
	missing string // why path is empty
}

// blob is where blob digest lives, if it is served. A prebuilt index's
// blobs are stored by their directory and the file's path is made here, on
// request: a start does not build thousands of paths (each fresh megabyte
// a new process allocates costs it page faults).
func (ix *index) blob(digest string) (blobFile, bool) {
	bf, ok := ix.blobs[digest]
	if bf.inDir {
		bf.path, bf.inDir = bf.path+strings.TrimPrefix(digest, "sha256:"), false
	}
	return bf, ok
}

// manifest is one manifest or index, held in memory (they are small and
// served on every pull), with what it references. A manifest known from a
// prebuilt index is read on its first request (bytes): data is nil until
// then.
type manifest struct {
	digest       string
	mediaType    string
	size         int64
	data         []byte
	read         sync.Once
	readErr      error             // why the file does not give the indexed bytes, once read
	artifactType string            // for referrers: artifactType, or the config media type
	annotations  map[string]string // for referrers
	subject      string            // digest of the manifest it refers to, if any
	children     []string          // child manifests (index)
	blobs        []string          // config and layers (image manifest)
}

// repository is one served repository: its tags and everything a pull of
// it may fetch. What it may fetch (members) is worked out on the first
// request that needs it, not at start: a node with thousands of images
// answers sooner, and most repositories are pulled once per boot at most.
type repository struct {
	tags    map[string]string // tag → manifest digest
	tagList []string          // in lexicalOrder
	named   []string          // manifests named in it (by tag or digest), in order

	closure   sync.Once
	manifests map[string]bool // the named manifests, their children and referrers
	blobs     map[string]bool // those manifests and their config and layers
}

// index is everything the server knows, loaded once at start.
type index struct {
	repos     map[string]*repository
	repoList  []string // in lexicalOrder
	manifests map[string]*manifest
	blobs     map[string]blobFile
	referrers map[string][]string // subject digest → referrer digests, sorted
	damaged   int                 // blobs missing or of the wrong size at start
	prebuilt  int                 // layouts served from the factory's prebuilt index
}

// Stats counts what a server serves (for logs and sd_notify STATUS=).
// Damaged counts what the start found damaged; a layout with a prebuilt
// index (Prebuilt) is not looked at before READY, its manifests and blobs
// are checked when first served. Verity counts the Layouts on dm-verity.
type Stats struct {
	Repositories, Tags, Manifests, Blobs, Damaged, Prebuilt int
	Layouts, Verity                                         int
}

func (ix *index) stats() Stats {
	st := Stats{Repositories: len(ix.repos), Manifests: len(ix.manifests), Blobs: len(ix.blobs), Damaged: ix.damaged, Prebuilt: ix.prebuilt}
	for _, r := range ix.repos {
		st.Tags += len(r.tags)
	}
	return st
}

// maxLayoutFile bounds the oci-layout file, a line of JSON.
const maxLayoutFile = 4096

// layoutRoot returns the OCI layout directory for dir: dir itself, or
// dir/oci when dir is an image partition root (it has kiln.json).
func layoutRoot(dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, contract.ContentsFile)); err == nil {
		dir = filepath.Join(dir, contract.OCIDir)
	}
	// Blobs are opened without following a final symlink; the directories
	// above them must not be symlinks either, or a blob could live anywhere.
	for _, sub := range []string{ocispec.ImageBlobsDir, filepath.Join(ocispec.ImageBlobsDir, "sha256")} {
		if fi, err := os.Lstat(filepath.Join(dir, sub)); err == nil && !fi.IsDir() {
			return "", fmt.Errorf("%s/%s is not a directory (%s): the registry serves only files inside the layout", dir, sub, fi.Mode().Type())
		}
	}
	b, err := inputfile.ReadFile(filepath.Join(dir, ocispec.ImageLayoutFile), maxLayoutFile, inputfile.NoFollow()) // a FIFO here once hung kiln serve
	if err != nil {
		return "", fmt.Errorf("%s is not an OCI image layout or kiln image partition (no oci-layout file): %w", dir, err)
	}
	var l struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(b, &l); err != nil || l.Version != "1.0.0" {
		return "", fmt.Errorf("%s/oci-layout: want imageLayoutVersion 1.0.0 (file damaged? verify the partition with `kiln verify`)", dir)
	}
	return dir, nil
}

// named is one name a manifest was served under.
type named struct{ repo, tag, digest string }

// loader builds an index from one or more layouts.
type loader struct {
	ix        *index
	log       *slog.Logger
	named     []named // every addToRepo, in order, when building a prebuilt index (keepNames)
	keepNames bool
}

func loadIndex(dirs []string, rs *releaseSource, log *slog.Logger) (*index, error) {
	if len(dirs) == 0 {
		return nil, errors.New("no OCI layout directories given")
	}
	roots := make([]string, len(dirs))
	for i, d := range dirs {
		root, err := layoutRoot(d)
		if err != nil {
			return nil, err
		}
		roots[i] = root
	}
	l := &loader{ix: newIndex(), log: log}
	// Releases first: the first source to tag a repo:tag wins, and the
	// active release must win over the partition's factory content.
	if rs != nil {
		if err := l.loadReleases(rs, roots); err != nil {
			return nil, err
		}
	}
	for _, root := range roots {
		if l.loadPrebuilt(root) {
			continue
		}
		if err := l.loadLayout(root); err != nil {
			return nil, err
		}
	}
	l.finish()
	return l.ix, nil
}

func newIndex() *index {
	return &index{
		repos:     map[string]*repository{},
		manifests: map[string]*manifest{},
		blobs:     map[string]blobFile{},
		referrers: map[string][]string{},
	}
}

// grow makes room for blobs, manifests and repos more entries at once, so
// a start from a prebuilt index does not rehash its maps as they fill.
func (ix *index) grow(blobs, manifests, repos int) {
	if len(ix.blobs) == 0 {
		ix.blobs = make(map[string]blobFile, blobs)
	}
	if len(ix.manifests) == 0 {
		ix.manifests = make(map[string]*manifest, manifests)
	}
	if len(ix.repos) == 0 {
		ix.repos = make(map[string]*repository, repos)
		ix.repoList = make([]string, 0, repos)
	}
}

// rawManifest is what the server reads of a manifest or an index (Docker's
// schema 2 types have the same shape): an image manifest plus an index's
// manifests.
type rawManifest struct {
	ocispec.Manifest
	Manifests []ocispec.Descriptor `json:"manifests"`
}

func (l *loader) loadLayout(root string) error {
	src := layoutBlobs(root)
	f, err := inputfile.OpenFile(filepath.Join(root, ocispec.ImageIndexFile), inputfile.NoFollow())
	if err != nil {
		return fmt.Errorf("read OCI layout %s: %w", root, err)
	}
	defer f.Close()
	if err := inputfile.CheckSize(f, maxManifestSize); err != nil {
		return fmt.Errorf("%w: an index.json this large is not served (on an image partition: damaged, verify it with `kiln verify`; "+
			"a layout of your own: split its images across several layouts, kiln serve takes several directories)", err)
	}
	var idx ocispec.Index
	if err := json.NewDecoder(io.LimitReader(f, maxManifestSize)).Decode(&idx); err != nil {
		return fmt.Errorf("%s/index.json: %w (file damaged? verify the partition with `kiln verify`)", root, err)
	}
	for i, d := range idx.Manifests {
		where := fmt.Sprintf("%s/index.json manifests[%d]", root, i)
		if !validDigest(d.Digest.String()) {
			l.log.Warn("skipping index entry: digest is not sha256", "entry", where, "digest", d.Digest)
			continue
		}
		if err := l.loadManifest(src, d, where); err != nil {
			return fmt.Errorf("%w (the layout is damaged: verify the image partition with `kiln verify` or reflash it)", err)
		}
		refName, ok := d.Annotations[ocispec.AnnotationRefName]
		if !ok {
			continue // unnamed: served only as a referrer of a named image
		}
		repo, tag, digest, err := ParseName(refName)
		if err != nil {
			l.log.Warn("skipping index entry: ref.name is not a full image reference; rebuild the layout with names like quay.io/acme/app:1.2",
				"entry", where, "error", err)
			continue
		}
		if digest != "" && digest != d.Digest.String() {
			l.log.Warn("skipping index entry: ref.name digest differs from the entry's digest", "entry", where, "refName", refName)
			continue
		}
		l.addToRepo(repo, tag, d.Digest.String(), where)
	}
	return nil
}

// loadManifest reads, verifies and records the manifest d and, for an index,
// its children. A missing top-level manifest is an error (the layout is
// damaged); a missing child is a warning (a layout may hold one platform of
// a multi-platform image).
func (l *loader) loadManifest(src blobSource, d ocispec.Descriptor, where string) error {
	if _, ok := l.ix.manifests[d.Digest.String()]; ok {
		return nil
	}
	path, store, fi, lerr := src.locate(d.Digest.String())
	if path == "" {
		return fmt.Errorf("%s: manifest %s is %s: %w", where, d.Digest, src.nowhere(), os.ErrNotExist)
	}
	data, err := readVerified(path, d)
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
	m := &manifest{digest: d.Digest.String(), mediaType: raw.MediaType, size: d.Size, data: data, annotations: raw.Annotations, artifactType: raw.ArtifactType}
	if m.mediaType == "" {
		m.mediaType = d.MediaType
	}
	if m.mediaType == "" {
		return fmt.Errorf("%s: manifest %s has no media type", where, d.Digest)
	}
	if raw.Subject != nil && validDigest(raw.Subject.Digest.String()) {
		m.subject = raw.Subject.Digest.String()
	}
	hasConfig := raw.Config.Digest != ""
	if hasConfig && m.artifactType == "" {
		m.artifactType = raw.Config.MediaType
	}
	l.ix.manifests[m.digest] = m
	l.recordBlob(src, d, where, path, store, fi, lerr) // manifests are blobs too; located above
	for _, c := range raw.Manifests {
		if !validDigest(c.Digest.String()) {
			continue
		}
		err := l.loadManifest(src, c, where+" → "+d.Digest.String())
		if errors.Is(err, os.ErrNotExist) {
			l.log.Warn("index references a manifest not in the layout; that platform is not served", "entry", where, "manifest", c.Digest)
			continue
		}
		if err != nil {
			return err
		}
		m.children = append(m.children, c.Digest.String())
	}
	var blobs []ocispec.Descriptor
	if hasConfig {
		blobs = append(blobs, raw.Config)
	}
	blobs = append(blobs, raw.Layers...)
	for _, b := range blobs {
		if !validDigest(b.Digest.String()) {
			l.log.Warn("manifest references a non-sha256 blob; it is not served", "manifest", d.Digest, "blob", b.Digest)
			continue
		}
		l.addBlob(src, b, where)
		m.blobs = append(m.blobs, b.Digest.String())
	}
	return nil
}

// addBlob records where blob d lives. The first source holding it wins.
// Its file is lstat'ed, never read: damage is logged now and reported to
// clients when they ask for it.
func (l *loader) addBlob(src blobSource, d ocispec.Descriptor, where string) {
	if _, ok := l.ix.blobs[d.Digest.String()]; ok {
		return
	}
	path, store, fi, err := src.locate(d.Digest.String())
	l.recordBlob(src, d, where, path, store, fi, err)
}

// recordBlob records blob d where locate found it (path, store, its lstat
// fi or the lstat's error), unless a source before already holds it.
func (l *loader) recordBlob(src blobSource, d ocispec.Descriptor, where, path string, store bool, fi os.FileInfo, err error) {
	if _, ok := l.ix.blobs[d.Digest.String()]; ok {
		return
	}
	l.ix.blobs[d.Digest.String()] = blobFile{path: path, size: d.Size, store: store, missing: src.nowhere()}
	if path == "" {
		l.ix.damaged++
		l.log.Error("blob is "+src.nowhere()+": it is not served (404); roll the release back (kiln agent release rollback VERSION) and plug its stick in again",
			"digest", d.Digest, "entry", where)
		return
	}
	fix := damageFix(store)
	switch {
	case err != nil:
		l.ix.damaged++
		l.log.Error("blob file missing: "+fix, "file", path, "entry", where, "error", err)
	case !fi.Mode().IsRegular():
		l.ix.damaged++
		l.log.Error("blob file is not a regular file (a symlink?): it is never served; "+fix,
			"file", path, "entry", where, "type", fi.Mode().Type().String())
	case fi.Size() != d.Size:
		l.ix.damaged++
		l.log.Error("blob file has the wrong size: "+fix, "file", path, "entry", where, "size", fi.Size(), "want", d.Size)
	}
}

// damageFix is what a technician does about a damaged blob file.
func damageFix(store bool) string {
	if store {
		return "the release store on /var is damaged; roll the release back (kiln agent release rollback VERSION) and plug its stick in again"
	}
	return "the image partition is damaged; verify it with `kiln verify` or reflash it"
}

// readVerified reads a manifest file, checking its size and digest. A
// negative d.Size is unknown (a release names its manifests by digest
// only): the file may be up to maxManifestSize.
func readVerified(path string, d ocispec.Descriptor) ([]byte, error) {
	if d.Size > maxManifestSize {
		return nil, fmt.Errorf("size %d is over the %d byte manifest limit", d.Size, maxManifestSize)
	}
	limit := d.Size
	if limit < 0 {
		limit = maxManifestSize
	}
	data, err := inputfile.ReadFile(path, limit, inputfile.NoFollow())
	var tooLarge *inputfile.TooLargeError
	switch {
	case errors.As(err, &tooLarge) && tooLarge.Size > maxManifestSize && limit >= maxManifestSize:
		return nil, fmt.Errorf("%s is over the limit of %d bytes (%s) for a manifest", path, int64(maxManifestSize), human.Bytes(maxManifestSize))
	case errors.As(err, &tooLarge): // longer than its descriptor says
		return nil, fmt.Errorf("%s does not match its digest", path)
	case err != nil:
		return nil, err
	}
	sum := sha256.Sum256(data)
	if (d.Size >= 0 && int64(len(data)) != d.Size) || "sha256:"+hex.EncodeToString(sum[:]) != d.Digest.String() {
		return nil, fmt.Errorf("%s does not match its digest", path)
	}
	return data, nil
}

// addToRepo names manifest digest in repo, under tag if set. The first
// source to tag repo:tag wins the tag; the other manifest stays pullable by
// digest (a rollback target's image, say).
func (l *loader) addToRepo(repoName, tag, digest, where string) {
	if l.keepNames {
		l.named = append(l.named, named{repoName, tag, digest})
	}
	r := l.ix.repos[repoName]
	if r == nil {
		r = &repository{tags: map[string]string{}}
		l.ix.repos[repoName] = r
		l.ix.repoList = append(l.ix.repoList, repoName)
	}
	r.named = append(r.named, digest)
	if tag != "" {
		if old, ok := r.tags[tag]; ok && old != digest {
			l.log.Warn("tag present twice with different digests; the first source wins it (the other is served by digest only)",
				"image", repoName+":"+tag, "kept", old, "ignored", digest, "entry", where)
		} else {
			r.tags[tag] = digest
		}
	}
}

// finish links referrers to their subjects and sorts the lists served.
func (l *loader) finish() {
	ix := l.ix
	for d, m := range ix.manifests {
		if m.subject != "" {
			ix.referrers[m.subject] = append(ix.referrers[m.subject], d)
		}
	}
	for _, refs := range ix.referrers {
		sort.Strings(refs)
	}
	for _, r := range ix.repos {
		r.tagList = make([]string, 0, len(r.tags))
		for t := range r.tags {
			r.tagList = append(r.tagList, t)
		}
		sortLexical(r.tagList)
	}
	// In the order the layouts name them, often sorted already: the sort
	// then only checks it (at 2,000 repositories, from a map's random
	// order, it was a fifth of an in-process start).
	sortLexical(ix.repoList)
}

// members returns what r serves, worked out on the first call: its named
// manifests, their children and blobs, and every referrer of any of them
// (referrers of referrers too: a signature of an SBOM).
func (ix *index) members(r *repository) (manifests, blobs map[string]bool) {
	r.closure.Do(func() {
		r.manifests, r.blobs = map[string]bool{}, map[string]bool{}
		for _, d := range r.named {
			ix.addClosure(r, d)
		}
		for changed := true; changed; {
			changed = false
			for d := range r.manifests {
				for _, ref := range ix.referrers[d] {
					if !r.manifests[ref] {
						ix.addClosure(r, ref)
						changed = true
					}
				}
			}
		}
	})
	return r.manifests, r.blobs
}

// addClosure adds manifest digest, its children and their blobs to r.
func (ix *index) addClosure(r *repository, digest string) {
	if r.manifests[digest] {
		return
	}
	m := ix.manifests[digest]
	if m == nil {
		return
	}
	r.manifests[digest] = true
	r.blobs[digest] = true
	for _, b := range m.blobs {
		r.blobs[b] = true
	}
	for _, c := range m.children {
		ix.addClosure(r, c)
	}
}

// referrersIndex renders the referrers of subject within repo as an OCI
// image index, optionally filtered by artifactType.
func (ix *index) referrersIndex(r *repository, subject, artifactType string) []byte {
	out := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{},
	}
	members, _ := ix.members(r)
	for _, d := range ix.referrers[subject] {
		m := ix.manifests[d]
		if !members[d] || (artifactType != "" && m.artifactType != artifactType) {
			continue
		}
		out.Manifests = append(out.Manifests, ocispec.Descriptor{
			MediaType: m.mediaType, Digest: digest.Digest(d), Size: m.size,
			ArtifactType: m.artifactType, Annotations: m.annotations,
		})
	}
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(out)
	return buf.Bytes()
}

func sortLexical(list []string) { slices.SortFunc(list, lexicalOrder) }

// lexicalOrder is the order the spec wants tag lists in: "lexical order
// (i.e. case-insensitive alphanumeric order)"; byte order breaks ties, so
// the order is total and pagination by `last` is exact.
//
// Names and tags are ASCII (their grammars): compared byte by byte without
// allocating, as a start sorts thousands of them; anything else through
// strings.ToLower.
func lexicalOrder(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		if ca == cb && ca < 0x80 {
			continue // names share long prefixes: no case folding for them
		}
		if ca >= 0x80 || cb >= 0x80 {
			if c := strings.Compare(strings.ToLower(a[i:]), strings.ToLower(b[i:])); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		}
		if 'A' <= ca && ca <= 'Z' {
			ca += 'a' - 'A'
		}
		if 'A' <= cb && cb <= 'Z' {
			cb += 'a' - 'A'
		}
		if ca != cb {
			return int(ca) - int(cb)
		}
	}
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}
