package fetch

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Transports a recipe's image source may use.
const (
	TransportDocker        = "docker"
	TransportOCI           = "oci"
	TransportDockerArchive = "docker-archive"
)

// source is a parsed image source string. It mirrors recipes.Source so this
// package does not depend on the recipe parser.
type source struct {
	Transport string
	Ref       string // docker: the image reference
	Path      string // oci, docker-archive: directory or file, made absolute
	Tag       string // oci: TAG; docker-archive: REF (may be empty)
	raw       string
}

func (s source) String() string { return s.raw }

// parseSource splits "docker://REF", "oci:DIR[:TAG]" or
// "docker-archive:FILE[:REF]". Like skopeo, the path ends at the first colon
// after the transport, so TAG may itself be a full reference with a colon.
// Relative paths are joined to baseDir.
func parseSource(s, baseDir string) (source, error) {
	src := source{raw: s}
	transport, rest, ok := strings.Cut(s, ":")
	if !ok || rest == "" || strings.ContainsAny(transport, "./") { // "quay.io/app:1", "host:5000/app"
		return src, fmt.Errorf("image source %q has no transport; write docker://REF for a registry, oci:DIR[:TAG] for an OCI layout or docker-archive:FILE[:REF] for a `docker save` archive", s)
	}
	src.Transport = transport
	switch transport {
	case TransportDocker:
		ref, ok := strings.CutPrefix(rest, "//")
		if !ok || ref == "" {
			return src, fmt.Errorf("image source %q: docker sources are written docker://REGISTRY/REPO:TAG", s)
		}
		src.Ref = ref
		return src, nil
	case TransportOCI, TransportDockerArchive:
		path, tag, _ := strings.Cut(rest, ":")
		if path == "" {
			return src, fmt.Errorf("image source %q: missing path after %q", s, transport+":")
		}
		if !filepath.IsAbs(path) && baseDir != "" {
			path = filepath.Join(baseDir, path)
		}
		src.Path, src.Tag = path, tag
		return src, nil
	}
	return src, fmt.Errorf("image source %q: unknown transport %q; want docker://, oci: or docker-archive:", s, transport)
}
