// Package preload writes container images into a containers/storage store
// (overlay driver layout) that ships on the image partition as /storage and
// is used on the node as a read-only additional image store (or copied into
// the main store at first boot; see systemd/agent/preloadcopy).
//
// The store is built with containers/image's copy from the staged OCI layout
// into containers/storage, digests preserved, and then made host-independent
// and reproducible (see normalize.go): random overlay link ids, lock-file
// tokens, wall-clock timestamps and build-host state are pinned or removed.
//
// Programs that call Build must start main with
//
//	if reexec.Init() { return }
//
// (go.podman.io/storage/pkg/reexec): containers/storage unpacks layers in a
// chrooted child process of the same binary.
package preload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-appliance/kiln/builder/internal/leftover"
	"github.com/kiln-appliance/kiln/internal/progress"
	digest "github.com/opencontainers/go-digest"
	imgspecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	"go.podman.io/image/v5/copy"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/oci/layout"
	"go.podman.io/image/v5/signature"
	istorage "go.podman.io/image/v5/storage"
	"go.podman.io/image/v5/types"
	"go.podman.io/storage"
)

// Driver is the containers/storage graph driver of the store.
const Driver = "overlay"

// RunRootPrefix starts the name of the run root a preload creates in
// $TMPDIR (with its owner's tag, see builder/internal/leftover).
const RunRootPrefix = "kiln-preload-run-"

// Image is one image to preload.
type Image struct {
	Name      string // recipe name, e.g. "quay.io/acme/app:1.2"
	LayoutDir string // OCI layout containing it
	Digest    string // manifest digest (platform-specific), as in the lock
}

// Result describes the store Build wrote.
type Result struct {
	Images []Stored
	Size   int64 // disk usage of the store, hard links counted once
}

// Stored is one image as recorded in the store.
type Stored struct {
	Name      string
	Digest    string // manifest digest (== Image.Digest)
	ImageID   string // config digest, "sha256:…" (the store's image ID, hex only, in c/storage)
	MediaType string // manifest media type
	Size      int64  // manifest + config + compressed layers, bytes
}

type options struct {
	os, arch, variant string
	created           time.Time
	progress          progress.Reporter
}

// Option tunes Build.
type Option func(*options)

// WithPlatform sets the platform every image must be for (default linux/amd64).
func WithPlatform(os, arch, variant string) Option {
	return func(o *options) { o.os, o.arch, o.variant = os, arch, variant }
}

// WithTime sets the timestamp written into the store's metadata and used
// for directories the build creates (default: the Unix epoch). Pass the
// build's SOURCE_DATE_EPOCH.
func WithTime(t time.Time) Option { return func(o *options) { o.created = t.UTC() } }

// WithProgress reports one task per image.
func WithProgress(r progress.Reporter) Option { return func(o *options) { o.progress = r } }

// Build writes images into a new containers/storage store at storeDir,
// which must not exist yet (its parent must). On error nothing is left at
// storeDir.
func Build(ctx context.Context, storeDir string, images []Image, opts ...Option) (_ *Result, err error) {
	o := options{os: "linux", arch: "amd64", created: time.Unix(0, 0).UTC(), progress: progress.Discard()}
	for _, opt := range opts {
		opt(&o)
	}
	if len(images) == 0 {
		return nil, errors.New("preload: no images to preload")
	}
	seen := map[string]string{}
	for _, img := range images {
		if d, ok := seen[img.Name]; ok && d != img.Digest {
			return nil, fmt.Errorf("preload: image name %s is listed twice, for %s and %s; a name can mean one image only: fix the recipe or lock", img.Name, d, img.Digest)
		}
		seen[img.Name] = img.Digest
	}
	// Check everything before any work is written: the target, the
	// privileges (cheap), then every image and layer (reads them all).
	if _, err := os.Lstat(storeDir); err == nil {
		return nil, fmt.Errorf("preload: store directory %s already exists; remove it or pick an empty staging path", storeDir)
	}
	if err := CheckPrivileges(filepath.Dir(storeDir)); err != nil {
		return nil, err
	}
	srcs := make([]source, len(images))
	for i, img := range images {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("preload: %w", err)
		}
		if srcs[i], err = resolve(img, o); err != nil {
			return nil, err
		}
	}

	start := time.Now()
	runRoot, err := os.MkdirTemp("", leftover.Pattern(RunRootPrefix))
	if err != nil {
		return nil, fmt.Errorf("preload: %w", err)
	}
	defer os.RemoveAll(runRoot)
	if err := os.Mkdir(storeDir, 0o700); err != nil {
		return nil, fmt.Errorf("preload: create store: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(storeDir) // nothing half-written
		}
	}()

	store, err := storage.GetStore(storage.StoreOptions{
		GraphRoot:       storeDir,
		RunRoot:         runRoot,
		GraphDriverName: Driver,
		// nodev matches what CRI-O and podman mount with; the store never
		// depends on host storage.conf.
		// skip_mount_home: no private bind mount of the store over
		// itself, so nothing stays mounted in the staging tree.
		GraphDriverOptions: []string{"overlay.mountopt=nodev", "overlay.skip_mount_home=true"},
	})
	if err != nil {
		return nil, fmt.Errorf("preload: open containers/storage store at %s: %w", storeDir, err)
	}
	defer func() {
		if store != nil {
			store.Shutdown(true)
		}
	}()

	policy, err := signature.NewPolicyContext(&signature.Policy{
		Default: signature.PolicyRequirements{signature.NewPRInsecureAcceptAnything()},
	})
	if err != nil {
		return nil, err
	}
	defer policy.Destroy()

	res := &Result{}
	for i, src := range srcs {
		st, err := copyOne(ctx, store, policy, src, o)
		if err != nil {
			return nil, fmt.Errorf("preload %s (%s): %w", images[i].Name, images[i].LayoutDir, err)
		}
		res.Images = append(res.Images, st)
	}
	if _, err := store.Shutdown(true); err != nil {
		return nil, fmt.Errorf("preload: close store: %w", err)
	}
	store = nil
	if err := normalize(storeDir, start, o.created); err != nil {
		return nil, fmt.Errorf("preload: make store reproducible: %w", err)
	}
	if res.Size, err = StoreSize(storeDir); err != nil {
		return nil, err
	}
	return res, nil
}

// source is an image located in its layout.
type source struct {
	img       Image
	named     reference.Named
	ref       types.ImageReference // oci: reference to the manifest or its index
	sys       *types.SystemContext // platform choice when ref is an index
	digest    digest.Digest
	mediaType string
	size      int64
	configID  digest.Digest
}

// resolve finds img's manifest in its layout, either listed directly in
// index.json or as an instance of an image index listed there, and checks
// its platform.
func resolve(img Image, o options) (source, error) {
	s := source{img: img}
	fail := func(format string, a ...any) (source, error) {
		return source{}, fmt.Errorf("preload %s: "+format, append([]any{img.Name}, a...)...)
	}
	named, err := reference.ParseNormalizedNamed(img.Name)
	if err != nil {
		return fail("invalid image name: %v", err)
	}
	s.named = named
	if s.digest, err = digest.Parse(img.Digest); err != nil {
		return fail("invalid manifest digest %q: %v", img.Digest, err)
	}
	index, err := readIndex(img.LayoutDir)
	if err != nil {
		return fail("%v", err)
	}
	// Listed directly?
	for i, d := range index.Manifests {
		if d.Digest == s.digest && !isIndex(d.MediaType) {
			s.ref, err = layout.NewIndexReference(img.LayoutDir, i)
			if err != nil {
				return fail("%v", err)
			}
			return s.check(o)
		}
	}
	// An instance of a listed index: copy selects it by platform.
	for i, d := range index.Manifests {
		if !isIndex(d.MediaType) {
			continue
		}
		child, err := readBlobJSON[imgspecv1.Index](img.LayoutDir, d.Digest)
		if err != nil {
			return fail("%v", err)
		}
		for _, m := range child.Manifests {
			if m.Digest != s.digest {
				continue
			}
			if m.Platform == nil {
				return fail("manifest %s in index %s of %s has no platform, so it cannot be selected", s.digest, d.Digest, img.LayoutDir)
			}
			s.ref, err = layout.NewIndexReference(img.LayoutDir, i)
			if err != nil {
				return fail("%v", err)
			}
			s.sys = &types.SystemContext{OSChoice: m.Platform.OS, ArchitectureChoice: m.Platform.Architecture, VariantChoice: m.Platform.Variant}
			return s.check(o)
		}
	}
	return fail("manifest %s not found in OCI layout %s (index.json lists %d entries); stage the image or fix the lock", s.digest, img.LayoutDir, len(index.Manifests))
}

// check reads the manifest and config blobs and checks the platform.
func (s source) check(o options) (source, error) {
	fail := func(format string, a ...any) (source, error) {
		return source{}, fmt.Errorf("preload %s: "+format, append([]any{s.img.Name}, a...)...)
	}
	raw, err := readBlob(s.img.LayoutDir, s.digest, 4<<20)
	if err != nil {
		return fail("%v", err)
	}
	s.mediaType = manifest.GuessMIMEType(raw)
	m, err := manifest.FromBlob(raw, s.mediaType)
	if err != nil {
		return fail("manifest %s: %v", s.digest, err)
	}
	s.configID = m.ConfigInfo().Digest
	s.size = int64(len(raw)) + m.ConfigInfo().Size
	for _, l := range m.LayerInfos() {
		s.size += l.Size
	}
	cfg, err := readBlobJSON[imgspecv1.Image](s.img.LayoutDir, s.configID)
	if err != nil {
		return fail("config %s: %v", s.configID, err)
	}
	if cfg.OS != o.os || cfg.Architecture != o.arch || (o.variant != "" && cfg.Variant != o.variant) {
		want := o.os + "/" + o.arch
		if o.variant != "" {
			want += "/" + o.variant
		}
		return fail("manifest %s is for platform %s/%s, the appliance is %s; lock the image for %s", s.digest, cfg.OS, cfg.Architecture, want, want)
	}
	var layers []types.BlobInfo
	for _, l := range m.LayerInfos() {
		layers = append(layers, l.BlobInfo)
	}
	if err := s.scanLayers(layers); err != nil {
		return source{}, err
	}
	return s, nil
}

func isIndex(mt string) bool {
	return mt == imgspecv1.MediaTypeImageIndex || mt == manifest.DockerV2ListMediaType
}

func readIndex(dir string) (*imgspecv1.Index, error) {
	f, err := os.Open(filepath.Join(dir, imgspecv1.ImageIndexFile))
	if err != nil {
		return nil, fmt.Errorf("read OCI layout: %w", err)
	}
	defer f.Close()
	var idx imgspecv1.Index
	if err := json.NewDecoder(io.LimitReader(f, 64<<20)).Decode(&idx); err != nil {
		return nil, fmt.Errorf("parse %s: %w", f.Name(), err)
	}
	return &idx, nil
}

// readBlob reads a small blob (manifest, config) and verifies its digest.
func readBlob(dir string, d digest.Digest, limit int64) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "blobs", d.Algorithm().String(), d.Encoded())
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read blob: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", p, err)
	}
	if got := d.Algorithm().FromBytes(b); got != d {
		return nil, fmt.Errorf("blob %s is corrupt: its digest is %s", p, got)
	}
	return b, nil
}

func readBlobJSON[T any](dir string, d digest.Digest) (*T, error) {
	b, err := readBlob(dir, d, 4<<20)
	if err != nil {
		return nil, err
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("parse blob %s: %w", d, err)
	}
	return &v, nil
}

// copyOne copies one image into the store, byte for byte, and checks the
// store recorded the expected digests.
func copyOne(ctx context.Context, store storage.Store, policy *signature.PolicyContext, s source, o options) (Stored, error) {
	task := o.progress.Task(s.img.Name, s.size)
	dest, err := istorage.Transport.NewStoreReference(store, reference.TagNameOnly(s.named), "")
	if err != nil {
		task.Done(err)
		return Stored{}, err
	}
	events := make(chan types.ProgressProperties)
	forwarded := make(chan struct{})
	go forwardProgress(events, task, forwarded)
	_, err = copy.Image(ctx, policy, dest, s.ref, &copy.Options{
		SourceCtx:        s.sys,
		DestinationCtx:   &types.SystemContext{},
		PreserveDigests:  true, // fail rather than convert: the lock's digests must hold
		ReportWriter:     io.Discard,
		Progress:         events,
		ProgressInterval: 500 * time.Millisecond,
	})
	close(events)
	<-forwarded
	if err != nil {
		task.Done(err)
		return Stored{}, err
	}
	img, err := store.Image(s.configID.Encoded())
	if err != nil {
		err = fmt.Errorf("image %s not in the store after copy: %w", s.configID, err)
		task.Done(err)
		return Stored{}, err
	}
	if img.Digest != s.digest {
		err = fmt.Errorf("store recorded manifest digest %s, want %s (the copy converted the image)", img.Digest, s.digest)
		task.Done(err)
		return Stored{}, err
	}
	// The digest name lets tools resolve name@digest without the tag.
	if err := store.AddNames(img.ID, []string{reference.TrimNamed(s.named).String() + "@" + s.digest.String()}); err != nil {
		task.Done(err)
		return Stored{}, err
	}
	task.Done(nil)
	return Stored{Name: s.img.Name, Digest: s.digest.String(), ImageID: s.configID.String(), MediaType: s.mediaType, Size: s.size}, nil
}

// forwardProgress turns c/image's blob progress events into byte counts on
// task (a progress.Task counts bytes written, not their content).
func forwardProgress(events <-chan types.ProgressProperties, task progress.Task, done chan<- struct{}) {
	defer close(done)
	var zeros [32 << 10]byte
	counted := map[digest.Digest]int64{}
	for ev := range events {
		n := int64(0)
		switch ev.Event {
		case types.ProgressEventRead:
			n = int64(ev.OffsetUpdate)
		case types.ProgressEventDone:
			// Small blobs finish between two read events.
			n = max(int64(ev.Offset), ev.Artifact.Size) - counted[ev.Artifact.Digest]
		case types.ProgressEventSkipped:
			n = ev.Artifact.Size
		}
		counted[ev.Artifact.Digest] += n
		for n > 0 {
			k := min(n, int64(len(zeros)))
			task.Write(zeros[:k]) //nolint:errcheck // progress only
			n -= k
		}
	}
}
