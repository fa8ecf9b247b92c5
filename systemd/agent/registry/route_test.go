package registry

import (
	"path/filepath"
	"strings"
	"testing"
)

const hexDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParseRoute(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path string
		want route
		code string // error code; "" = ok
	}{
		{"/v2/", route{kind: routeBase}, ""},
		{"/v2", route{kind: routeBase}, ""},
		{"/v2/_catalog", route{kind: routeCatalog}, ""},
		{"/v2/quay.io/a/manifests/1", route{routeManifest, "quay.io/a", "1"}, ""},
		{"/v2/quay.io/manifests/manifests/1", route{routeManifest, "quay.io/manifests", "1"}, ""},
		{"/v2/quay.io/a/b/blobs/" + hexDigest, route{routeBlob, "quay.io/a/b", hexDigest}, ""},
		{"/v2/quay.io/a/tags/list", route{kind: routeTags, name: "quay.io/a"}, ""},
		{"/v2/quay.io/a/referrers/" + hexDigest, route{routeReferrers, "quay.io/a", hexDigest}, ""},
		{"/v2/quay.io/a/blobs/uploads/", route{kind: routeUpload, name: "quay.io/a"}, ""},
		{"/v2/quay.io/a/blobs/uploads/x", route{kind: routeUpload, name: "quay.io/a"}, ""},
		{"/v2/localhost:5000/a/manifests/1", route{routeManifest, "localhost:5000/a", "1"}, ""},
		{"/v2/quay.io/a/blobs/uploads", route{}, codeDigestInvalid},
		{"/v2/quay.io/a/tags/x", route{}, codeNameUnknown},
		{"/v2/a/manifests/1", route{}, codeNameUnknown}, // spec-valid, but no host: not here
		{"/v2/a/B/manifests/1", route{}, codeNameInvalid},
		{"/v2/../a/manifests/1", route{}, codeNameInvalid},
		{"/v2/quay.io/../../a/manifests/1", route{}, codeNameInvalid},
		{"/v2/quay.io/a%2F..%2F..%2Fb/manifests/1", route{}, codeNameInvalid},
		{"/v2/quay.io/a%5Cb/manifests/1", route{}, codeNameInvalid},
		{"/v2/quay.io/a\\b/manifests/1", route{}, codeNameInvalid},
		{"/v2/quay.io/a\x00/manifests/1", route{}, codeNameInvalid},
		{"/v2/quay.io/a/manifests/..", route{}, codeManifestUnknown},
		{"/v2/quay.io/a/manifests/.INVALID_MANIFEST_NAME", route{}, codeManifestUnknown},
		{"/v2/quay.io/a/blobs/sha512:" + strings.Repeat("ab", 64), route{routeBlob, "quay.io/a", "sha512:" + strings.Repeat("ab", 64)}, ""},
		{"/v2/quay.io/a/manifests/%2e%2e%2f", route{}, codeManifestUnknown},
		{"/v2/quay.io/a/blobs/sha256:..%2f..%2f", route{}, codeDigestInvalid},
		{"/v2/quay.io/a/manifests/%zz", route{}, codeDigestInvalid},
		{"/v2/quay.io/" + strings.Repeat("a", 300) + "/manifests/1", route{}, codeNameInvalid},
		{"/v3/", route{}, codeNameUnknown},
	} {
		t.Run(tc.path, func(t *testing.T) {
			got, err := parseRoute(tc.path)
			if tc.code != "" {
				if err == nil || err.Code != tc.code {
					t.Fatalf("parseRoute(%q) = %+v, %v; want error %s", tc.path, got, err, tc.code)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseRoute(%q) = %+v, %v; want %+v", tc.path, got, err, tc.want)
			}
		})
	}
}

// staysInside reports whether joining name under a layout root can only
// address something inside it.
func staysInside(name string) bool {
	root := "/layout"
	p := filepath.Join(root, name)
	return strings.HasPrefix(p, root+"/") && !strings.ContainsAny(name, "\\\x00%") && !strings.Contains("/"+name+"/", "/../")
}
