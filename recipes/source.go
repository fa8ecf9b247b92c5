package recipes

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Source is a parsed image source, in the transport syntax skopeo uses.
type Source struct {
	Transport string // "docker", "oci" or "docker-archive"
	// Ref is the image reference: the registry reference for docker, the
	// optional tag reference inside the archive for docker-archive.
	Ref string
	// Path is the layout directory (oci) or archive file (docker-archive), as
	// written: resolve relative paths with Recipe.Resolve.
	Path string
	// Tag selects an image in an oci layout by its
	// org.opencontainers.image.ref.name annotation; empty when the layout
	// holds exactly one image.
	Tag string
}

// Transports kiln reads from.
const (
	TransportDocker        = "docker"
	TransportOCI           = "oci"
	TransportDockerArchive = "docker-archive"
)

// ociRefName is what containers/image accepts as an OCI layout reference name
// (oci/internal's refRegexp).
var ociRefName = regexp.MustCompile(`^(?:[A-Za-z0-9]+(?:(?:[-._:@+]|--)[A-Za-z0-9]+)*)(?:/(?:[A-Za-z0-9]+(?:(?:[-._:@+]|--)[A-Za-z0-9]+)*))*$`)

// ParseSource parses "docker://REF", "oci:DIR[:TAG]" or
// "docker-archive:FILE[:REF]". As in containers/image, the path ends at its
// first colon, so a path cannot contain one.
func ParseSource(s string) (Source, error) {
	transport, rest, ok := strings.Cut(s, ":")
	if !ok || strings.ContainsAny(transport, "./") { // "quay.io/…", "quay.io:5000/…": a bare reference
		return Source{}, fmt.Errorf("source %q has no transport; write docker://%s for a registry, oci:DIR[:TAG] for an OCI layout directory or docker-archive:FILE[:REF] for a docker save archive", s, s)
	}
	switch transport {
	case TransportDocker:
		ref, ok := strings.CutPrefix(rest, "//")
		if !ok || ref == "" {
			return Source{}, fmt.Errorf("source %q: a registry source is written docker://REGISTRY/REPOSITORY:TAG", s)
		}
		if _, err := parseImageName(ref); err != nil {
			return Source{}, fmt.Errorf("source %q: %q %v", s, ref, err)
		}
		return Source{Transport: TransportDocker, Ref: ref}, nil
	case TransportOCI:
		dir, tag, _ := strings.Cut(rest, ":")
		if dir == "" {
			return Source{}, fmt.Errorf("source %q: an OCI layout source is written oci:DIR or oci:DIR:TAG", s)
		}
		if tag != "" && !ociRefName.MatchString(tag) {
			return Source{}, fmt.Errorf("source %q: %q is not a valid OCI reference name", s, tag)
		}
		return Source{Transport: TransportOCI, Path: dir, Tag: tag}, nil
	case TransportDockerArchive:
		file, ref, hasRef := strings.Cut(rest, ":")
		if file == "" {
			return Source{}, fmt.Errorf("source %q: a docker archive source is written docker-archive:FILE or docker-archive:FILE:REF", s)
		}
		if hasRef {
			if _, err := name.NewTag(ref); err != nil || strings.Contains(ref, "@") {
				return Source{}, fmt.Errorf("source %q: %q is not a tag reference like acme/app:1.2 (as in the archive's RepoTags)", s, ref)
			}
		}
		return Source{Transport: TransportDockerArchive, Path: file, Ref: ref}, nil
	case "http", "https":
		return Source{}, fmt.Errorf("source %q: kiln does not download from URLs; use docker://REGISTRY/REPOSITORY:TAG for a registry", s)
	}
	return Source{}, fmt.Errorf("source %q has unknown transport %q; kiln reads docker://, oci: and docker-archive:", s, transport+":")
}

// String writes the source back in transport syntax.
func (s Source) String() string {
	switch s.Transport {
	case TransportDocker:
		return "docker://" + s.Ref
	case TransportOCI:
		if s.Tag != "" {
			return "oci:" + s.Path + ":" + s.Tag
		}
		return "oci:" + s.Path
	case TransportDockerArchive:
		if s.Ref != "" {
			return "docker-archive:" + s.Path + ":" + s.Ref
		}
		return "docker-archive:" + s.Path
	}
	return ""
}
