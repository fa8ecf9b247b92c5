package fetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Kinds of failure, for errors.Is. Every error this package returns wraps at
// most one of them, together with what failed, where, and how to fix it.
var (
	ErrNotFound    = errors.New("image not found")
	ErrAuth        = errors.New("registry refused access")
	ErrUnreachable = errors.New("registry unreachable")
	ErrPlatform    = errors.New("image not available for platform")
	ErrCorrupt     = errors.New("corrupt blob")
	ErrBadSource   = errors.New("bad image source")
	// ErrLockMismatch: the lock's digest is not what the source has for
	// the image's name.
	ErrLockMismatch = errors.New("the lock and the source disagree")
	// ErrLockedIndex (an ErrLockMismatch): the lock's index digest does
	// not list the lock's manifest digest for the platform, or the source
	// has no such index.
	ErrLockedIndex = fmt.Errorf("%w about the index", ErrLockMismatch)
)

// RequestError is FetchAll's error: which request failed, and why.
type RequestError struct {
	Index int    // in the requests
	Name  string // Request.Name
	Err   error
}

func (e *RequestError) Error() string {
	if e.Name == "" {
		return e.Err.Error()
	}
	return "image " + e.Name + ": " + e.Err.Error()
}

func (e *RequestError) Unwrap() error { return e.Err }

// loginHint tells a technician how to give kiln registry credentials. kiln
// reads them through go-containerregistry's default keychain.
const loginHint = "log in with `skopeo login HOST` (writes $XDG_RUNTIME_DIR/containers/auth.json, or $REGISTRY_AUTH_FILE) " +
	"or `docker login HOST` (writes ~/.docker/config.json, or $DOCKER_CONFIG/config.json), then run kiln again"

// registryError turns an error from a registry into one a technician can
// act on. what names the thing being fetched (a reference or blob).
func registryError(what, host string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if strings.Contains(err.Error(), "does not match requested digest") { // go-containerregistry checked a manifest
		return fmt.Errorf("%w: %s: registry %s served a manifest that does not match its digest; the registry's copy is damaged: %v", ErrCorrupt, what, host, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		codes := map[transport.ErrorCode]bool{}
		for _, d := range te.Errors {
			codes[d.Code] = true
		}
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			codes[transport.UnauthorizedErrorCode] || codes[transport.DeniedErrorCode]:
			return fmt.Errorf("%w: %s: registry %s answered %d; %s: %v", ErrAuth, what, host, te.StatusCode,
				strings.ReplaceAll(loginHint, "HOST", host), err)
		case codes[transport.NameUnknownErrorCode]:
			return fmt.Errorf("%w: %s: the repository does not exist on %s; check the name in the recipe: %v", ErrNotFound, what, host, err)
		case codes[transport.ManifestUnknownErrorCode]:
			return fmt.Errorf("%w: %s: no such tag or digest on %s; check the tag in the recipe (or the lock file's digest): %v", ErrNotFound, what, host, err)
		case codes[transport.BlobUnknownErrorCode]:
			return fmt.Errorf("%w: %s: registry %s lacks a blob the manifest names; the image on the registry is incomplete: %v", ErrNotFound, what, host, err)
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %s: %s answered 404; check the repository and tag in the recipe: %v", ErrNotFound, what, host, err)
		}
		return fmt.Errorf("%s: registry %s: %w", what, host, err)
	}
	var ne net.Error
	var oe *net.OpError
	var de *net.DNSError
	if errors.As(err, &oe) || errors.As(err, &de) || errors.As(err, &ne) {
		return fmt.Errorf("%w: %s: cannot reach %s; check the factory's network and proxy settings, "+
			"or build from a local copy (source: oci:DIR or docker-archive:FILE): %v", ErrUnreachable, what, host, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
