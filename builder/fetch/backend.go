package fetch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kiln-appliance/kiln/internal/inputfile"
)

// refNameAnnotation is where OCI layouts keep an entry's reference.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// maxManifestSize bounds how much of a manifest, index or config is read into
// memory (the distribution spec's registries cap manifests at 4 MiB; configs
// with long histories can be bigger).
const maxManifestSize = 16 << 20

// Option adjusts how images are resolved and fetched.
type Option func(*options)

type options struct {
	insecure bool
}

// WithInsecure lets docker:// sources use plain HTTP registries. (Loopback
// and RFC 1918 registries use HTTP without it.)
func WithInsecure() Option { return func(o *options) { o.insecure = true } }

func makeOptions(opts []Option) *options {
	o := &options{}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// backend reads one image source. Callers check every digest: a backend
// only finds bytes.
type backend interface {
	// top returns the descriptor the source's tag points at and its raw bytes.
	top(ctx context.Context) (v1.Descriptor, []byte, error)
	// manifest returns the raw bytes of the manifest or index h.
	manifest(ctx context.Context, h v1.Hash) ([]byte, error)
	// blob opens the config or layer blob d, compressed as stored.
	blob(ctx context.Context, d v1.Descriptor) (io.ReadCloser, error)
}

func openBackend(src source, platform v1.Platform, o *options) (backend, error) {
	switch src.Transport {
	case TransportDocker:
		return newDockerBackend(src, o)
	case TransportOCI:
		return newOCIBackend(src, platform)
	case TransportDockerArchive:
		return newArchiveBackend(src)
	}
	return nil, fmt.Errorf("%w: %s: unknown transport", ErrBadSource, src)
}

// dockerBackend reads a registry with go-containerregistry's remote package.
type dockerBackend struct {
	src  source
	ref  name.Reference
	opts []remote.Option
}

func newDockerBackend(src source, o *options) (*dockerBackend, error) {
	var nopts []name.Option
	if o.insecure {
		nopts = append(nopts, name.Insecure)
	}
	ref, err := name.ParseReference(src.Ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSource, src, err)
	}
	// go-containerregistry's transport, but a registry that accepts the
	// connection and never answers is an error, not a hang.
	rt := remote.DefaultTransport.(*http.Transport).Clone()
	rt.ResponseHeaderTimeout = stallTimeout
	ropts := []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithUserAgent("kiln"), remote.WithTransport(rt)}
	return &dockerBackend{src: src, ref: ref, opts: ropts}, nil
}

func (b *dockerBackend) host() string { return b.ref.Context().RegistryStr() }

func (b *dockerBackend) get(ctx context.Context, ref name.Reference) (v1.Descriptor, []byte, error) {
	d, err := remote.Get(ref, append(b.opts, remote.WithContext(ctx))...)
	if err != nil {
		return v1.Descriptor{}, nil, registryError(ref.String(), b.host(), err)
	}
	return d.Descriptor, d.Manifest, nil
}

func (b *dockerBackend) top(ctx context.Context) (v1.Descriptor, []byte, error) {
	return b.get(ctx, b.ref)
}

func (b *dockerBackend) manifest(ctx context.Context, h v1.Hash) ([]byte, error) {
	_, raw, err := b.get(ctx, b.ref.Context().Digest(h.String()))
	return raw, err
}

func (b *dockerBackend) blob(ctx context.Context, d v1.Descriptor) (io.ReadCloser, error) {
	ref := b.ref.Context().Digest(d.Digest.String())
	l, err := remote.Layer(ref, append(b.opts, remote.WithContext(ctx))...)
	if err != nil {
		return nil, registryError(ref.String(), b.host(), err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, registryError(ref.String(), b.host(), err)
	}
	return rc, nil
}

// ociBackend reads an OCI image layout directory. Its files are opened
// with inputfile, so a FIFO in a layout is refused, never waited on.
type ociBackend struct {
	src      source
	platform v1.Platform
}

func newOCIBackend(src source, platform v1.Platform) (*ociBackend, error) {
	fi, err := os.Stat(src.Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: %s: directory %s does not exist; check the source path in the recipe (relative paths start at the recipe's directory)", ErrBadSource, src, src.Path)
	case err != nil:
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSource, src, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("%w: %s: %s is a file, not an OCI layout directory (for a tar file made by `docker save` use docker-archive:%s)", ErrBadSource, src, src.Path, src.Path)
	}
	for _, f := range []string{"oci-layout", "index.json"} {
		err := inputfile.Check(filepath.Join(src.Path, f))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("%w: %s: %s is not an OCI image layout (no %s); create one with `skopeo copy docker://REF oci:%s:TAG`", ErrBadSource, src, src.Path, f, src.Path)
		case err != nil:
			return nil, fmt.Errorf("%w: %s: %v", ErrBadSource, src, err)
		}
	}
	return &ociBackend{src: src, platform: platform}, nil
}

// index reads the layout's index.json.
func (b *ociBackend) index() (*v1.IndexManifest, error) {
	raw, err := inputfile.ReadFile(filepath.Join(b.src.Path, "index.json"), maxManifestSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: read index.json: %v", ErrBadSource, b.src, err)
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: parse index.json: %v", ErrBadSource, b.src, err)
	}
	return im, nil
}

func (b *ociBackend) top(ctx context.Context) (v1.Descriptor, []byte, error) {
	im, err := b.index()
	if err != nil {
		return v1.Descriptor{}, nil, err
	}
	d, err := b.pick(im.Manifests)
	if err != nil {
		return v1.Descriptor{}, nil, err
	}
	raw, err := b.manifest(ctx, d.Digest)
	return d, raw, err
}

// pick finds the index.json entry the source's TAG names: the whole
// ref.name annotation ("quay.io/acme/app:1.2") or its tag part ("1.2").
// Without TAG the layout must hold exactly one entry.
func (b *ociBackend) pick(entries []v1.Descriptor) (v1.Descriptor, error) {
	var names []string
	var found []v1.Descriptor
	for _, d := range entries {
		ref := d.Annotations[refNameAnnotation]
		names = append(names, fmt.Sprintf("%q", ref))
		if b.src.Tag == "" || ref == b.src.Tag || tagPart(ref) == b.src.Tag {
			found = append(found, d)
		}
	}
	sort.Strings(names)
	if len(found) > 1 {
		var err error
		if found, err = b.byPlatform(found); err != nil {
			return v1.Descriptor{}, err
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) == 0 && b.src.Tag == "":
		return v1.Descriptor{}, fmt.Errorf("%w: %s: the layout %s is empty", ErrNotFound, b.src, b.src.Path)
	case len(found) == 0:
		return v1.Descriptor{}, fmt.Errorf("%w: %s: no image named %q in %s; it has %s", ErrNotFound, b.src, b.src.Tag, b.src.Path, strings.Join(names, ", "))
	case b.src.Tag == "":
		return v1.Descriptor{}, fmt.Errorf("%w: %s: the layout holds %d images (%s); say which, e.g. source: %s:%s", ErrBadSource, b.src, len(found), strings.Join(names, ", "), b.src, exampleRef(found))
	}
	return v1.Descriptor{}, fmt.Errorf("%w: %s: %d images in %s match %q; use the full name (%s)", ErrBadSource, b.src, len(found), b.src.Path, b.src.Tag, strings.Join(names, ", "))
}

// byPlatform narrows entries that share a name but each carry a platform
// (as `crane pull --platform` or layout.WithPlatform write them) to the one
// for b.platform. Entries without platforms are left for pick to refuse.
func (b *ociBackend) byPlatform(entries []v1.Descriptor) ([]v1.Descriptor, error) {
	var have []string
	for _, d := range entries {
		if d.Platform == nil {
			return entries, nil
		}
		if d.Platform.Satisfies(b.platform) {
			return []v1.Descriptor{d}, nil
		}
		have = append(have, d.Platform.String())
	}
	return nil, fmt.Errorf("%w: %s has no %s image; it has: %s. Pick an image built for %s, or change the recipe's arch",
		ErrPlatform, b.src, b.platform, strings.Join(have, ", "), b.platform)
}

// tagPart returns the tag of a reference ("1.2" of "quay.io/acme/app:1.2"),
// or "" if it has none.
func tagPart(ref string) string {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ""
	}
	return ref[i+1:]
}

func (b *ociBackend) open(h v1.Hash) (io.ReadCloser, error) {
	rc, err := inputfile.OpenFile(filepath.Join(b.src.Path, "blobs", h.Algorithm, h.Hex))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s: blob %s is missing from the layout %s; the copy is incomplete, copy the image again", ErrNotFound, b.src, h, b.src.Path)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: open blob %s: %w", b.src, h, err)
	}
	return rc, nil
}

func (b *ociBackend) manifest(_ context.Context, h v1.Hash) ([]byte, error) {
	rc, err := b.open(h)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return readSmall(rc, b.src, h)
}

func (b *ociBackend) blob(_ context.Context, d v1.Descriptor) (io.ReadCloser, error) {
	return b.open(d.Digest)
}

// archiveBackend reads a `docker save` tar with go-containerregistry's
// tarball package, which synthesises the manifest (and compresses
// uncompressed layers) as `docker push` would.
type archiveBackend struct {
	src source
	img v1.Image
}

func newArchiveBackend(src source) (*archiveBackend, error) {
	// go-containerregistry opens the archive by name, often: it must be a
	// file that cannot block it.
	if err := inputfile.Check(src.Path); errors.Is(err, inputfile.ErrNotFile) {
		return nil, fmt.Errorf("%w: %s: %v; give the file `docker save` wrote", ErrBadSource, src, err)
	} else if err != nil {
		return nil, fmt.Errorf("%w: %s: %v; check the source path in the recipe (relative paths start at the recipe's directory)", ErrBadSource, src, err)
	}
	var tag *name.Tag
	if src.Ref != "" {
		t, err := name.NewTag(src.Ref)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrBadSource, src, err)
		}
		tag = &t
	}
	img, err := tarball.ImageFromPath(src.Path, tag)
	if err == nil {
		_, err = img.RawManifest() // reads manifest.json and the config
	}
	if err != nil {
		// Say which images the archive does hold, if it can be read at all.
		if m, merr := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(src.Path) }); merr == nil {
			var tags []string
			for _, d := range m {
				tags = append(tags, d.RepoTags...)
			}
			switch {
			case tag == nil && len(m) > 1:
				return nil, fmt.Errorf("%w: %s: the archive holds %d images (%s); say which, e.g. source: %s:%s", ErrBadSource, src, len(m), strings.Join(tags, ", "), src, append(tags, "REF")[0])
			case tag != nil && !slices.Contains(tags, tag.Name()) && !slices.Contains(tags, src.Ref):
				return nil, fmt.Errorf("%w: %s: no image tagged %s in %s; it has %s", ErrNotFound, src, src.Ref, src.Path, strings.Join(tags, ", "))
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: not a readable docker archive (as made by `docker save` or `skopeo copy … docker-archive:FILE`): %v", ErrBadSource, src, err)
	}
	return &archiveBackend{src: src, img: img}, nil
}

func (b *archiveBackend) top(context.Context) (v1.Descriptor, []byte, error) {
	raw, err := b.img.RawManifest()
	if err != nil {
		return v1.Descriptor{}, nil, fmt.Errorf("%s: %w", b.src, err)
	}
	mt, err := b.img.MediaType()
	if err != nil {
		return v1.Descriptor{}, nil, fmt.Errorf("%s: %w", b.src, err)
	}
	h, n, _ := v1.SHA256(bytes.NewReader(raw))
	return v1.Descriptor{MediaType: mt, Digest: h, Size: n}, raw, nil
}

func (b *archiveBackend) manifest(ctx context.Context, h v1.Hash) ([]byte, error) {
	d, raw, err := b.top(ctx)
	if err != nil {
		return nil, err
	}
	if d.Digest != h {
		return nil, fmt.Errorf("%w: %s: the archive's image is now %s, not the locked %s; if the change is intended run `kiln lock` again", ErrNotFound, b.src, d.Digest, h)
	}
	return raw, nil
}

func (b *archiveBackend) blob(_ context.Context, d v1.Descriptor) (io.ReadCloser, error) {
	if cn, err := b.img.ConfigName(); err == nil && cn == d.Digest {
		raw, err := b.img.RawConfigFile()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.src, err)
		}
		return io.NopCloser(bytes.NewReader(raw)), nil
	}
	l, err := b.img.LayerByDigest(d.Digest)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: layer %s: %v", ErrNotFound, b.src, d.Digest, err)
	}
	return l.Compressed()
}

// readSmall reads a manifest, index or config, refusing absurd sizes.
func readSmall(r io.Reader, src source, h v1.Hash) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(r, maxManifestSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: read %s: %w", src, h, err)
	}
	if len(raw) > maxManifestSize {
		return nil, fmt.Errorf("%w: %s: %s is over %d bytes, too big for a manifest or config", ErrCorrupt, src, h, maxManifestSize)
	}
	return raw, nil
}

// checkManifest verifies that raw is the manifest with digest h.
func checkManifest(raw []byte, h v1.Hash, src source) error {
	got, n, _ := v1.SHA256(bytes.NewReader(raw))
	if got != h {
		return fmt.Errorf("%w: %s: manifest %s: expected %s, got %s (%d bytes); the source is damaged or changed after locking — copy it again, or run `kiln lock` if the change is intended",
			ErrCorrupt, src, h, h, got, n)
	}
	return nil
}

// kind is what a manifest's bytes say they are.
type kind struct {
	MediaType     string          `json:"mediaType"`
	SchemaVersion int             `json:"schemaVersion"`
	Manifests     json.RawMessage `json:"manifests"`
	Config        json.RawMessage `json:"config"`
}

func (k kind) isIndex() bool {
	switch k.MediaType {
	case "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json":
		return true
	case "":
		return k.Manifests != nil
	}
	return false
}

func kindOf(raw []byte, src source, h v1.Hash) (kind, error) {
	var k kind
	if err := json.Unmarshal(raw, &k); err != nil {
		return k, fmt.Errorf("%w: %s: %s is not a manifest: %v", ErrBadSource, src, h, err)
	}
	if k.SchemaVersion == 1 {
		return k, fmt.Errorf("%w: %s: %s is a Docker schema 1 manifest, which kiln does not support; re-push the image with a current docker, podman or skopeo", ErrBadSource, src, h)
	}
	if k.MediaType == "" && !k.isIndex() {
		k.MediaType = "application/vnd.oci.image.manifest.v1+json"
	}
	if k.MediaType == "" {
		k.MediaType = "application/vnd.oci.image.index.v1+json"
	}
	return k, nil
}

// pickPlatform narrows an index to the manifest for platform.
func pickPlatform(raw []byte, src source, platform v1.Platform) (v1.Descriptor, error) {
	im, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("%w: %s: parse index: %v", ErrBadSource, src, err)
	}
	var have []string
	for _, d := range im.Manifests {
		if d.Platform == nil || d.Platform.OS == "unknown" { // attestations, signatures
			continue
		}
		if d.Platform.Satisfies(platform) {
			return d, nil
		}
		have = append(have, d.Platform.String())
	}
	if len(have) == 0 {
		have = []string{"none"}
	}
	return v1.Descriptor{}, fmt.Errorf("%w: %s has no %s image; it has: %s. Pick an image built for %s, or change the recipe's arch",
		ErrPlatform, src, platform, strings.Join(have, ", "), platform)
}

// exampleRef is the name of one of found for a hint ("TAG" when unnamed).
func exampleRef(found []v1.Descriptor) string {
	for _, d := range found {
		if ref := d.Annotations[refNameAnnotation]; ref != "" {
			return ref
		}
	}
	return "TAG"
}
