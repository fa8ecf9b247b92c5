package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
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
// prebuilt index is read on its first request (bytes): Data is nil until
// then.
type manifest struct {
	regindex.Manifest
	read    sync.Once
	readErr error // why the file does not give the indexed bytes, once read
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

// loader builds an index from one or more layouts and the releases: the
// walk (regindex.Walker) reads them as the factory's index builder does,
// the loader keeps what it finds (it is the walk's regindex.Sink).
type loader struct {
	ix   *index
	log  *slog.Logger
	walk regindex.Walker
}

func newLoader(log *slog.Logger) *loader {
	l := &loader{ix: newIndex(), log: log}
	l.walk = regindex.Walker{Sink: l, Log: log}
	return l
}

func (l *loader) HasManifest(d string) bool { _, ok := l.ix.manifests[d]; return ok }
func (l *loader) HasBlob(d string) bool     { _, ok := l.ix.blobs[d]; return ok }

func (l *loader) AddManifest(m regindex.Manifest) {
	l.ix.manifests[m.Digest] = &manifest{Manifest: m}
}

func (l *loader) AddBlob(d string, b regindex.Blob) {
	l.ix.blobs[d] = blobFile{path: b.Path, size: b.Size, store: b.Store, missing: b.Missing}
}

func (l *loader) AddName(repo, tag, digest, where string) { l.addToRepo(repo, tag, digest, where) }

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
	l := newLoader(log)
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
		if err := l.walk.Layout(root); err != nil {
			return nil, err
		}
	}
	l.ix.damaged += l.walk.Damaged
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

// addToRepo names manifest digest in repo, under tag if set. The first
// source to tag repo:tag wins the tag; the other manifest stays pullable by
// digest (a rollback target's image, say).
func (l *loader) addToRepo(repoName, tag, digest, where string) {
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
		if m.Subject != "" {
			ix.referrers[m.Subject] = append(ix.referrers[m.Subject], d)
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
	for _, b := range m.Blobs {
		r.blobs[b] = true
	}
	for _, c := range m.Children {
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
		if !members[d] || (artifactType != "" && m.ArtifactType != artifactType) {
			continue
		}
		out.Manifests = append(out.Manifests, ocispec.Descriptor{
			MediaType: m.MediaType, Digest: digest.Digest(d), Size: m.Size,
			ArtifactType: m.ArtifactType, Annotations: m.Annotations,
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
