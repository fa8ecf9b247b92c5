package registry

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// FuzzRoute feeds arbitrary request paths to the router and the server:
// nothing may panic, every accepted name must be a valid repository name
// that cannot address a file outside the layout, and no request may make
// the server fail (5xx) on an undamaged layout.
func FuzzRoute(f *testing.F) {
	fx := newFixture(f)
	s, err := New([]string{fx.dir}, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithRequestLog(false))
	if err != nil {
		f.Fatal(err)
	}
	app := "/v2/quay.io/acme/app"
	for _, p := range []string{"/v2/", "/v2/_catalog?n=1&last=a", app + "/manifests/1.2", app + "/manifests/" + fx.appDigest.String(),
		app + "/blobs/" + fx.appDigest.String(), app + "/tags/list?n=1", app + "/referrers/" + fx.appDigest.String() + "?artifactType=x",
		"/v2/quay.io/../../etc/manifests/1", "/v2/quay.io/a%2F..%2Fb/blobs/uploads/", "/v2/quay.io/a\\b/manifests/1",
		"/v2/quay.io/a%00/tags/list", "/v2//manifests/", "/v2/quay.io/a/blobs/sha256:..%2f"} {
		f.Add(p, false)
		f.Add(p, true)
	}
	f.Fuzz(func(t *testing.T, path string, head bool) {
		rt, aerr := parseRoute(path)
		if aerr == nil && rt.name != "" {
			if regindex.ValidName(rt.name) != nil || !staysInside(rt.name) {
				t.Fatalf("parseRoute(%q) accepted name %q", path, rt.name)
			}
			switch rt.kind {
			case routeBlob, routeReferrers:
				if !regindex.ValidDigest(rt.ref) {
					t.Fatalf("parseRoute(%q) accepted digest %q", path, rt.ref)
				}
			case routeManifest:
				if !regindex.ValidDigest(rt.ref) && !regindex.ValidTag(rt.ref) {
					t.Fatalf("parseRoute(%q) accepted reference %q", path, rt.ref)
				}
			}
		}
		u, err := url.ParseRequestURI(path)
		if err != nil {
			return
		}
		method := http.MethodGet
		if head {
			method = http.MethodHead
		}
		req := &http.Request{Method: method, URL: u, Header: http.Header{}, Body: http.NoBody, Host: "x", RequestURI: path}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %q: status %d: %s", method, path, rec.Code, rec.Body)
		}
	})
}
