package recipes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/opencontainers/go-digest"
)

// Lock pins every image of a recipe to the digest of its manifest for the
// recipe's platform. Builds read images by these digests only, so a rebuild
// from the same recipe, lock and base is the same disk.
type Lock struct {
	APIVersion string        `yaml:"apiVersion"` // APIVersion
	Kind       string        `yaml:"kind"`       // KindLock
	Inputs     string        `yaml:"inputs"`     // Recipe.LockInputs of the recipe it was made from
	Platform   string        `yaml:"platform"`   // e.g. linux/amd64
	Images     []LockedImage `yaml:"images"`     // in the recipe's order when written

	// Path is the file the lock was read from. Not YAML.
	Path string `yaml:"-"`

	// pos remembers where each field was written (Errorf points there).
	pos map[string]position
}

// LockedImage is one image resolved to a digest.
type LockedImage struct {
	Name        string `yaml:"name"`                  // as in the recipe
	Source      string `yaml:"source"`                // the image's effective source
	Digest      string `yaml:"digest"`                // manifest digest for the platform
	IndexDigest string `yaml:"indexDigest,omitempty"` // when the source pointed at a multi-arch index
	MediaType   string `yaml:"mediaType"`             // of the manifest
	Size        int64  `yaml:"size"`                  // manifest + config + layers, bytes
}

// ManifestMediaTypes are the manifest media types a lock may pin.
var ManifestMediaTypes = []string{
	"application/vnd.oci.image.manifest.v1+json",
	"application/vnd.docker.distribution.manifest.v2+json",
}

var platforms = []string{"linux/amd64", "linux/arm64"}

// lockHeader starts every lock file kiln writes.
const lockHeader = "# Written by `kiln lock`; do not edit. Run `kiln lock RECIPE` to refresh it.\n"

// LockPath is the lock file beside a recipe: demo.yaml → demo.lock.
func LockPath(recipePath string) string {
	ext := filepath.Ext(recipePath)
	if ext == ".yaml" || ext == ".yml" {
		recipePath = strings.TrimSuffix(recipePath, ext)
	}
	return recipePath + ".lock"
}

// NewLock starts a lock for r with the given resolved images (in the
// recipe's order).
func NewLock(r *Recipe, images []LockedImage) *Lock {
	return &Lock{APIVersion: APIVersion, Kind: KindLock, Inputs: r.LockInputs(), Platform: r.Platform(), Images: images}
}

// LockInputs is a digest of everything in the recipe the lock depends on:
// the platform and each image's name and effective source. It ignores the
// order of the images (reordering them needs no new lock) and everything
// else in the recipe (serve, preload, sizes, Ignition…), which does not
// change what the images resolve to.
func (r *Recipe) LockInputs() string {
	type input struct {
		Name   string `json:"name"`
		Source string `json:"source"`
	}
	in := struct {
		Platform string  `json:"platform"`
		Images   []input `json:"images"`
	}{Platform: r.Platform(), Images: []input{}}
	for _, img := range r.Images {
		in.Images = append(in.Images, input{img.Name, img.EffectiveSource()})
	}
	slices.SortFunc(in.Images, func(a, b input) int { return strings.Compare(a.Name+"\x00"+a.Source, b.Name+"\x00"+b.Source) })
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // strings only; cannot fail
	}
	return digest.FromBytes(append([]byte("kiln lock inputs v1\n"), b...)).String()
}

// ReadLock reads and validates a lock file. Problems come back as an
// ErrorList with FILE:LINE:COLUMN; a missing file wraps fs.ErrNotExist.
func ReadLock(path string) (*Lock, error) {
	data, err := readSmallFile(path, "lock file")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w; create it with `kiln lock RECIPE`", err)
	}
	if err != nil {
		return nil, err
	}
	return ParseLock(path, data)
}

// ParseLock is ReadLock for a lock already in memory.
func ParseLock(path string, data []byte) (*Lock, error) {
	d := newDocument(path)
	l := &Lock{Path: path}
	top := d.parse(data, "a lock file is written by `kiln lock RECIPE`")
	if top != nil && !d.wrongKind(top, KindRecipe, "this is a recipe, not a lock file; a lock file is written by `kiln lock RECIPE`") {
		d.decode(top, reflect.ValueOf(l).Elem(), "")
		l.pos = d.pos
		l.validate(d)
	}
	if len(d.errs) > 0 {
		return nil, d.errs.sorted()
	}
	return l, nil
}

func (l *Lock) validate(d *document) {
	v := validator{d}
	if v.required("apiVersion", l.APIVersion, `a lock starts with "apiVersion: `+APIVersion+`"`) && l.APIVersion != APIVersion {
		v.errorf("apiVersion", "%q is not a version this kiln reads; run `kiln lock RECIPE` to rewrite the lock", l.APIVersion)
	}
	if v.required("kind", l.Kind, `add "kind: `+KindLock+`"`) && l.Kind != KindLock {
		v.errorf("kind", "%q: a lock file has \"kind: %s\"", l.Kind, KindLock)
	}
	if v.required("inputs", l.Inputs, "run `kiln lock RECIPE` to rewrite the lock") {
		v.digest("inputs", l.Inputs)
	}
	if v.required("platform", l.Platform, "run `kiln lock RECIPE` to rewrite the lock") {
		v.oneOf("platform", l.Platform, platforms, nil)
	}
	seen := map[string]string{}
	for i, img := range l.Images {
		field := fmt.Sprintf("images[%d]", i)
		if v.required(field+".name", img.Name, "run `kiln lock RECIPE` to rewrite the lock") {
			if _, err := parseImageName(img.Name); err != nil {
				v.errorf(field+".name", "%q %v", img.Name, err)
			} else if prev, dup := seen[img.Name]; dup {
				v.errorf(field+".name", "%q is locked twice (also at %s)", img.Name, prev)
			}
			seen[img.Name] = field
		}
		if v.required(field+".source", img.Source, "run `kiln lock RECIPE` to rewrite the lock") {
			if _, err := ParseSource(img.Source); err != nil {
				v.errorf(field+".source", "%v", err)
			}
		}
		digestOK := v.required(field+".digest", img.Digest, "run `kiln lock RECIPE` to rewrite the lock") && v.digest(field+".digest", img.Digest)
		if img.IndexDigest != "" {
			v.digest(field+".indexDigest", img.IndexDigest)
		}
		if v.required(field+".mediaType", img.MediaType, "run `kiln lock RECIPE` to rewrite the lock") {
			v.oneOf(field+".mediaType", img.MediaType, ManifestMediaTypes, nil)
		}
		if img.Size <= 0 && v.ok(field+".size") {
			v.d.errorf(field+".size", "must be the image's size in bytes, greater than zero; run `kiln lock RECIPE` to rewrite the lock")
		}
		if pinned := pinnedDigest(img.Name); digestOK && pinned != "" && pinned != img.Digest && pinned != img.IndexDigest {
			v.errorf(field+".digest", "%s, but the name pins %s; run `kiln lock RECIPE` to rewrite the lock", img.Digest, pinned)
		}
	}
}

// pinnedDigest is the digest an image name already carries ("…@sha256:…"), or "".
func pinnedDigest(imageName string) string {
	if _, dgst, ok := strings.Cut(imageName, "@"); ok {
		return dgst
	}
	return ""
}

// Encode writes the lock as YAML, byte-for-byte the same for the same lock.
// It refuses a lock that ReadLock would refuse.
func (l *Lock) Encode() ([]byte, error) {
	d := newDocument("lock")
	l.validate(d)
	if len(d.errs) > 0 {
		return nil, fmt.Errorf("encode lock: %w", d.errs)
	}
	var buf bytes.Buffer
	buf.WriteString(lockHeader)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(l); err != nil {
		return nil, fmt.Errorf("encode lock: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode lock: %w", err)
	}
	return buf.Bytes(), nil
}

// Errorf is a problem with field (e.g. "size") of the lock's entry for the
// image name, placed where the lock file says it: FILE:LINE:COLUMN.
func (l *Lock) Errorf(name, field, format string, args ...any) *Error {
	d := newDocument(l.Path)
	if l.pos != nil {
		d.pos = l.pos
	}
	for i, img := range l.Images {
		if img.Name == name {
			field = fmt.Sprintf("images[%d].%s", i, field)
			break
		}
	}
	d.errorf(field, format, args...)
	return d.errs[0]
}

// Image finds the locked image with this name.
func (l *Lock) Image(name string) (LockedImage, bool) {
	for _, img := range l.Images {
		if img.Name == name {
			return img, true
		}
	}
	return LockedImage{}, false
}

// StaleLockError says why a lock no longer matches its recipe.
type StaleLockError struct {
	Lock    string   // lock file path
	Recipe  string   // recipe file path
	Changes []string // one line per change, in recipe order
}

func (e *StaleLockError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lock file %s is out of date with recipe %s:", e.Lock, e.Recipe)
	for _, c := range e.Changes {
		b.WriteString("\n  - ")
		b.WriteString(c)
	}
	fmt.Fprintf(&b, "\nrun `kiln lock %s` to refresh it", e.Recipe)
	return b.String()
}

// Check returns nil when the lock is fresh for r, else a *StaleLockError
// naming every change: arch changed, image added, image removed, source
// changed, or a digest-pinned name the lock disagrees with.
func (l *Lock) Check(r *Recipe) error {
	var changes []string
	if l.Platform != r.Platform() {
		changes = append(changes, fmt.Sprintf("arch changed: the lock is for %s, the recipe is for %s", l.Platform, r.Platform()))
	}
	inRecipe := map[string]bool{}
	for _, img := range r.Images {
		inRecipe[img.Name] = true
		locked, ok := l.Image(img.Name)
		switch {
		case !ok:
			changes = append(changes, fmt.Sprintf("image added: %s", img.Name))
		case locked.Source != img.EffectiveSource():
			changes = append(changes, fmt.Sprintf("source changed for %s: the lock has %s, the recipe has %s", img.Name, locked.Source, img.EffectiveSource()))
		case pinnedDigest(img.Name) != "" && pinnedDigest(img.Name) != locked.Digest && pinnedDigest(img.Name) != locked.IndexDigest:
			changes = append(changes, fmt.Sprintf("digest changed for %s: the lock has %s", img.Name, locked.Digest))
		}
	}
	for _, locked := range l.Images {
		if !inRecipe[locked.Name] {
			changes = append(changes, fmt.Sprintf("image removed: %s", locked.Name))
		}
	}
	if len(changes) == 0 && l.Inputs != r.LockInputs() {
		changes = append(changes, "the lock's inputs digest does not match the recipe (was the lock edited by hand?)")
	}
	if len(changes) == 0 {
		return nil
	}
	lockPath := l.Path
	if lockPath == "" {
		lockPath = LockPath(r.Path)
	}
	return &StaleLockError{Lock: lockPath, Recipe: r.Path, Changes: changes}
}
