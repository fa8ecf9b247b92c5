package registry

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// routeKind is which distribution API endpoint a request addresses.
type routeKind int

const (
	routeBase      routeKind = iota // /v2/
	routeCatalog                    // /v2/_catalog
	routeManifest                   // /v2/<name>/manifests/<reference>
	routeBlob                       // /v2/<name>/blobs/<digest>
	routeTags                       // /v2/<name>/tags/list
	routeReferrers                  // /v2/<name>/referrers/<digest>
	routeUpload                     // /v2/<name>/blobs/uploads/… (push only)
)

// route is a parsed request path. name and ref are validated: name by
// regindex.ValidName, ref as a tag or sha256 digest (see parseRoute).
type route struct {
	kind routeKind
	name string
	ref  string // tag or digest (manifests), digest (blobs, referrers)
}

// parseRoute parses the escaped request path (r.URL.EscapedPath(), never the
// decoded one, so "%2F" cannot smuggle a slash into a name). It returns an
// *apiError: NAME_INVALID for a bad name (checked first: before anything
// else is looked at), NAME_UNKNOWN-shaped 404 for paths that are no
// endpoint, DIGEST_INVALID for a malformed digest, MANIFEST_UNKNOWN for a
// manifest reference that is neither tag nor digest.
func parseRoute(escapedPath string) (route, *apiError) {
	rest, ok := strings.CutPrefix(escapedPath, "/v2/")
	if !ok {
		if escapedPath == "/v2" {
			return route{kind: routeBase}, nil
		}
		return route{}, errNotFound
	}
	if rest == "" {
		return route{kind: routeBase}, nil
	}
	if rest == "_catalog" {
		return route{kind: routeCatalog}, nil
	}
	parts := strings.Split(rest, "/")
	n := len(parts)
	if n < 3 {
		return route{}, errNotFound
	}
	var r route
	var nameParts []string
	switch {
	case parts[n-2] == "tags" && parts[n-1] == "list":
		r.kind, nameParts = routeTags, parts[:n-2]
	case parts[n-2] == "manifests":
		r.kind, r.ref, nameParts = routeManifest, parts[n-1], parts[:n-2]
	case parts[n-2] == "blobs":
		r.kind, r.ref, nameParts = routeBlob, parts[n-1], parts[:n-2]
	case parts[n-2] == "referrers":
		r.kind, r.ref, nameParts = routeReferrers, parts[n-1], parts[:n-2]
	default:
		// Push endpoints: /blobs/uploads/ and /blobs/uploads/<uuid>.
		if i := indexUploads(parts); i > 0 {
			r.kind, nameParts = routeUpload, parts[:i]
			break
		}
		return route{}, errNotFound
	}
	r.name = strings.Join(nameParts, "/")
	if err := regindex.ValidName(r.name); err != nil {
		// A name the spec allows but kiln never serves (no upstream host, as
		// "app") names a repository that is not here: 404, as the spec wants
		// for one that does not exist. Anything else is malformed.
		if regindex.SpecName(r.name) {
			return route{}, newError(http.StatusNotFound, codeNameUnknown, "repository "+r.name+
				" is not on this node (kiln serves names with their upstream host, e.g. quay.io/acme/app)")
		}
		return route{}, newError(http.StatusBadRequest, codeNameInvalid, err.Error())
	}
	if r.kind == routeTags || r.kind == routeUpload {
		return r, nil
	}
	// A reference needs no escaping; accept escaped ':' from lax clients.
	ref, err := url.PathUnescape(r.ref)
	if err != nil {
		return route{}, newError(400, codeDigestInvalid, "reference is not valid URL escaping")
	}
	r.ref = ref
	switch {
	case r.kind == routeManifest && !strings.Contains(ref, ":"):
		// Not a tag by the spec's grammar: no manifest can have that
		// reference, and the spec's answer to a manifest that does not exist
		// is 404 MANIFEST_UNKNOWN (TAG_INVALID is a schema1-era code).
		if !regindex.ValidTag(ref) {
			return route{}, newError(http.StatusNotFound, codeManifestUnknown, "no manifest has the reference "+strconv.Quote(ref)+
				" (a tag matches [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}, a digest is algorithm:hex)")
		}
	case !wellFormedDigest(ref):
		return route{}, newError(http.StatusBadRequest, codeDigestInvalid, "digest must be algorithm:encoded, e.g. sha256:<64 lowercase hex>")
	}
	return r, nil
}

// indexUploads returns the index of "blobs" in ".../blobs/uploads[/…]", or -1.
func indexUploads(parts []string) int {
	for i := len(parts) - 2; i > 0; i-- {
		if parts[i] == "blobs" && parts[i+1] == "uploads" && len(parts)-i <= 3 {
			return i
		}
	}
	return -1
}

// wellFormedDigest accepts any digest of a registered algorithm (sha256,
// sha384, sha512), not only the sha256 kiln stores: a well-formed digest
// that is not here is "unknown" (404), not "invalid" (400).
func wellFormedDigest(ref string) bool { return digest.Digest(ref).Validate() == nil }
