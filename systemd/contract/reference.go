package contract

import (
	"fmt"

	"go.podman.io/image/v5/docker/reference"
)

// Reference is an image name as the node's runtimes read it. It is parsed by
// containers/image, the library CRI-O and podman resolve names with, so the
// factory, the node's registry, the mirror gate and the pins agree with the
// runtime on every name: Docker Hub short names are normalised
// ("busybox:1.36" → host docker.io, path library/busybox), the host keeps the
// spelling a registries.conf prefix must match.
type Reference struct {
	Host   string // registry host[:port], e.g. quay.io, docker.io, localhost:5000
	Path   string // repository path under the host, e.g. acme/app, library/busybox
	Tag    string // "" when the name has none
	Digest string // "" when the name has none
}

// ParseReference parses and normalises an image name.
func ParseReference(s string) (Reference, error) {
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return Reference{}, fmt.Errorf("image name %q: %v", s, err)
	}
	r := Reference{Host: reference.Domain(named), Path: reference.Path(named)}
	if t, ok := named.(reference.Tagged); ok {
		r.Tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		r.Digest = d.Digest().String()
	}
	return r, nil
}

// Repository is host/path: how the node's registry namespaces repositories
// (/v2/<host>/<path>/…), so one mirror entry per upstream host serves all.
func (r Reference) Repository() string { return r.Host + "/" + r.Path }

// String is the fully qualified name: repository, then :tag, then @digest.
func (r Reference) String() string {
	s := r.Repository()
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}
