// Package fetch resolves recipe image sources to digests and fetches their
// blobs into a shared, digest-verified cache.
//
// Sources are "docker://REF" (a registry, credentials from the docker and
// podman auth files), "oci:DIR[:TAG]" (an OCI image layout) and
// "docker-archive:FILE[:REF]" (a `docker save` tar). Nothing a source serves
// is trusted: every manifest and blob is checked against its digest before it
// is used or stored.
package fetch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Resolved is an image source pinned to one platform-specific manifest:
// what the lock file records.
type Resolved struct {
	Source      string // as given
	Digest      string // manifest digest for the platform, "sha256:…"
	IndexDigest string // digest of the multi-arch index it was picked from, if any
	MediaType   string // manifest media type
	Size        int64  // manifest + config + layers, bytes
}

// Resolve finds the manifest source names for platform. Relative paths in
// oci: and docker-archive: sources are taken from baseDir.
func Resolve(ctx context.Context, source, baseDir string, platform v1.Platform, opts ...Option) (Resolved, error) {
	src, err := parseSource(source, baseDir)
	if err != nil {
		return Resolved{}, fmt.Errorf("%w: %v", ErrBadSource, err)
	}
	b, err := openBackend(src, platform, makeOptions(opts))
	if err != nil {
		return Resolved{}, err
	}
	desc, raw, err := b.top(ctx)
	if err != nil {
		return Resolved{}, err
	}
	if err := checkManifest(raw, desc.Digest, src); err != nil {
		return Resolved{}, err
	}
	k, err := kindOf(raw, src, desc.Digest)
	if err != nil {
		return Resolved{}, err
	}
	res := Resolved{Source: source}
	if k.isIndex() {
		res.IndexDigest = desc.Digest.String()
		if desc, err = pickPlatform(raw, src, platform); err != nil {
			return Resolved{}, err
		}
		if raw, err = b.manifest(ctx, desc.Digest); err != nil {
			return Resolved{}, err
		}
		if err := checkManifest(raw, desc.Digest, src); err != nil {
			return Resolved{}, err
		}
		if k, err = kindOf(raw, src, desc.Digest); err != nil {
			return Resolved{}, err
		}
		if k.isIndex() {
			return Resolved{}, fmt.Errorf("%w: %s: index %s nests another index for %s; kiln reads one level", ErrBadSource, src, res.IndexDigest, platform)
		}
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return Resolved{}, fmt.Errorf("%w: %s: parse manifest %s: %v", ErrBadSource, src, desc.Digest, err)
	}
	if res.IndexDigest == "" {
		// A single-platform image says its platform only in its config.
		if err := checkConfigPlatform(ctx, b, src, m.Config, platform); err != nil {
			return Resolved{}, err
		}
	}
	res.Digest = desc.Digest.String()
	res.MediaType = k.MediaType
	res.Size = int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		res.Size += l.Size
	}
	return res, nil
}

// checkConfigPlatform refuses a single-platform image built for another
// platform (an arm64-only image on an amd64 appliance would not start).
func checkConfigPlatform(ctx context.Context, b backend, src source, cd v1.Descriptor, platform v1.Platform) error {
	rc, err := b.blob(ctx, cd)
	if err != nil {
		return err
	}
	defer rc.Close()
	raw, err := readSmall(rc, src, cd.Digest)
	if err != nil {
		return err
	}
	if got, _, _ := v1.SHA256(bytes.NewReader(raw)); got != cd.Digest {
		return fmt.Errorf("%w: %s: config %s: expected %s, got %s; the source is damaged, copy it again", ErrCorrupt, src, cd.Digest, cd.Digest, got)
	}
	var cfg struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Variant      string `json:"variant"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%w: %s: parse config %s: %v", ErrBadSource, src, cd.Digest, err)
	}
	if cfg.Architecture == "" { // artifacts and hand-made images may not say
		return nil
	}
	have := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	if !have.Satisfies(platform) {
		return fmt.Errorf("%w: %s has no %s image; it has: %s. Pick an image built for %s, or change the recipe's arch",
			ErrPlatform, src, platform, have, platform)
	}
	return nil
}
