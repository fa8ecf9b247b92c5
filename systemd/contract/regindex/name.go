package regindex

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// maxNameLength bounds a repository name, as the distribution spec suggests.
const maxNameLength = 255

var (
	// hostRE is the first component of every served name: the upstream
	// registry host, with an optional port. Dot-separated labels, so "." and
	// ".." can never match.
	hostRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]{1,5})?$`)
	// componentRE is a path component of a repository name (distribution spec).
	componentRE = regexp.MustCompile(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$`)
	// tagRE is the distribution spec's tag grammar.
	tagRE = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
)

// ValidName reports whether name is a repository name kiln can serve:
// "host[:port]/component[/component…]". Anything else — "..", empty
// components, backslashes, NUL, percent signs — fails, so a valid name can
// never address a file.
func ValidName(name string) error {
	if name == "" || len(name) > maxNameLength {
		return fmt.Errorf("repository name must be 1 to %d characters", maxNameLength)
	}
	parts := strings.Split(name, "/")
	if len(parts) < 2 {
		return fmt.Errorf("repository name %q has no upstream host (want host/path, e.g. quay.io/acme/app)", name)
	}
	if !hostRE.MatchString(parts[0]) {
		return fmt.Errorf("repository name %q: %q is not a registry host", name, parts[0])
	}
	for _, p := range parts[1:] {
		if !componentRE.MatchString(p) {
			return fmt.Errorf("repository name %q: invalid path component %q", name, p)
		}
	}
	return nil
}

// SpecName reports whether name matches the distribution spec's name
// grammar (path components of [a-z0-9] separated by ., _, __ or dashes)
// within the length clients allow.
func SpecName(name string) bool {
	if len(name) > maxNameLength {
		return false
	}
	for p := range strings.SplitSeq(name, "/") {
		if !componentRE.MatchString(p) {
			return false
		}
	}
	return true
}

// ValidTag reports whether tag is the distribution spec's tag grammar.
func ValidTag(tag string) bool { return tagRE.MatchString(tag) }

// ValidDigest reports whether digest is the only kind kiln serves:
// "sha256:" and 64 lowercase hex digits. A loop, not a regexp: start-up
// checks every digest of every manifest (with a regexp, 20 % of the CPU of
// indexing 200 images).
func ValidDigest(digest string) bool {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for i := 0; i < len(hex); i++ {
		if c := hex[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ErrNotFullReference marks ref.name annotations that are not a full image
// reference (typically a bare tag, as `skopeo copy … oci:DIR:TAG` writes).
var ErrNotFullReference = errors.New("not a full image reference")

// ParseName maps an index.json `org.opencontainers.image.ref.name`
// annotation to the repository and tag (or digest) it is served under.
//
// The annotation must be a full reference with an explicit tag or digest:
// "quay.io/acme/app:1.2" or "quay.io/acme/app@sha256:…". Docker Hub short
// names are normalised by contract.ParseReference, as the node's runtime
// normalises them ("busybox:1.36" → "docker.io/library/busybox", tag "1.36"):
// the host is what a registries.conf mirror prefix matches. A bare tag
// ("1.2", "latest") names no repository and returns ErrNotFullReference.
func ParseName(refName string) (repo, tag, digest string, err error) {
	slash := strings.LastIndex(refName, "/")
	if !strings.Contains(refName, "@") && strings.LastIndex(refName, ":") < slash+1 {
		return "", "", "", fmt.Errorf("%q: %w (want host/repository:tag or host/repository@sha256:…)", refName, ErrNotFullReference)
	}
	ref, err := contract.ParseReference(refName)
	if err != nil {
		return "", "", "", err
	}
	repo = ref.Repository()
	if err := ValidName(repo); err != nil {
		return "", "", "", fmt.Errorf("%q: %w", refName, err)
	}
	switch {
	case ref.Digest != "": // a tag beside a digest is decoration: the digest names the manifest
		digest = ref.Digest
		if !ValidDigest(digest) {
			return "", "", "", fmt.Errorf("%q: digest must be sha256:<64 lowercase hex>", refName)
		}
	default:
		tag = ref.Tag
		if !ValidTag(tag) {
			return "", "", "", fmt.Errorf("%q: invalid tag %q", refName, tag)
		}
	}
	return repo, tag, digest, nil
}
