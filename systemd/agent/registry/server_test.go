package registry

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// apiErrorCode returns the first error code of a spec error body, or "".
func apiErrorCode(body []byte) string {
	var e struct {
		Errors []struct{ Code, Message string }
	}
	if json.Unmarshal(body, &e) != nil || len(e.Errors) == 0 {
		return ""
	}
	return e.Errors[0].Code
}

// TestRoutes runs every route against both starts: the layout indexed at
// start, and the factory's prebuilt index with manifests read on request.
func TestRoutes(t *testing.T) {
	for _, mode := range indexModes {
		t.Run(mode.name, func(t *testing.T) { testRoutes(t, mode) })
	}
}

func testRoutes(t *testing.T, mode indexMode) {
	f := newFixture(t)
	mode.prepare(t, f.dir)
	log, _ := testLogger()
	s, err := New([]string{f.dir}, WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Prebuilt; got != mode.prebuilt {
		t.Errorf("Stats().Prebuilt = %d, want %d", got, mode.prebuilt)
	}
	base := "http://" + serve(t, s)

	appRaw := must(f.app.RawManifest())
	appMf := must(f.app.Manifest())
	cfg := appMf.Config
	cfgBytes := must(f.app.RawConfigFile())
	layer := appMf.Layers[0]
	multiRaw := must(f.multi.RawManifest())
	multiMf := must(f.multi.IndexManifest())
	child := multiMf.Manifests[1].Digest // arm64
	childLayer := must(must(f.multi.Image(child)).Manifest()).Layers[0].Digest
	busyRaw := must(f.busy.RawManifest())
	app := "/v2/quay.io/acme/app"
	zero := "sha256:" + strings.Repeat("0", 64)

	type check func(t *testing.T, hdr map[string][]string, body []byte)
	bodyIs := func(want []byte) check {
		return func(t *testing.T, _ map[string][]string, body []byte) {
			if string(body) != string(want) {
				t.Errorf("body = %.200q, want %.200q", body, want)
			}
		}
	}
	jsonIs := func(want string) check {
		return func(t *testing.T, _ map[string][]string, body []byte) {
			var got, exp any
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			json.Unmarshal([]byte(want), &exp)
			if fmt.Sprint(got) != fmt.Sprint(exp) {
				t.Errorf("body = %s, want %s", body, want)
			}
		}
	}
	referrers := func(want ...v1.Hash) check {
		return func(t *testing.T, _ map[string][]string, body []byte) {
			var idx v1.IndexManifest
			if err := json.Unmarshal(body, &idx); err != nil {
				t.Fatal(err)
			}
			if idx.SchemaVersion != 2 || idx.MediaType != "application/vnd.oci.image.index.v1+json" || idx.Manifests == nil {
				t.Errorf("not an OCI index: %s", body)
			}
			var got []string
			for _, m := range idx.Manifests {
				got = append(got, m.Digest.String())
				if m.ArtifactType != sbomType && m.ArtifactType != sigType {
					t.Errorf("referrer %s: artifactType %q", m.Digest, m.ArtifactType)
				}
			}
			var exp []string
			for _, h := range want {
				exp = append(exp, h.String())
			}
			if fmt.Sprint(got) != fmt.Sprint(exp) && !(len(got) == 2 && len(exp) == 2 && got[0] == exp[1] && got[1] == exp[0]) {
				t.Errorf("referrers = %v, want %v", got, exp)
			}
		}
	}
	multipart := func(t *testing.T, hdr map[string][]string, body []byte) {
		mt, _, err := mime.ParseMediaType(strings.Join(hdr["Content-Type"], ""))
		if err != nil || mt != "multipart/byteranges" {
			t.Errorf("Content-Type %v, want multipart/byteranges", hdr["Content-Type"])
		}
	}

	for _, tc := range []struct {
		name, method, path string
		reqHdr             map[string]string
		status             int
		code               string            // error code expected in the body
		hdr                map[string]string // response headers expected
		check              check
	}{
		// Base and catalog.
		{"base", "GET", "/v2/", nil, 200, "", map[string]string{"Docker-Distribution-API-Version": "registry/2.0", "Content-Type": "application/json"}, bodyIs([]byte("{}"))},
		{"base without slash", "GET", "/v2", nil, 200, "", nil, bodyIs([]byte("{}"))},
		{"base HEAD", "HEAD", "/v2/", nil, 200, "", map[string]string{"Content-Length": "2"}, bodyIs(nil)},
		{"catalog", "GET", "/v2/_catalog", nil, 200, "", nil,
			jsonIs(`{"repositories":["docker.io/library/busybox","quay.io/acme/app","quay.io/acme/multi","quay.io/acme/pinned"]}`)},
		{"catalog n=2", "GET", "/v2/_catalog?n=2", nil, 200, "", map[string]string{"Link": `</v2/_catalog?n=2&last=quay.io%2Facme%2Fapp>; rel="next"`},
			jsonIs(`{"repositories":["docker.io/library/busybox","quay.io/acme/app"]}`)},
		{"catalog last page", "GET", "/v2/_catalog?n=2&last=quay.io%2Facme%2Fapp", nil, 200, "", map[string]string{"Link": ""},
			jsonIs(`{"repositories":["quay.io/acme/multi","quay.io/acme/pinned"]}`)},
		{"catalog n=0", "GET", "/v2/_catalog?n=0", nil, 200, "", map[string]string{"Link": ""}, jsonIs(`{"repositories":[]}`)},
		{"catalog n=-1", "GET", "/v2/_catalog?n=-1", nil, 400, codeUnsupported, nil, nil},
		{"catalog n=x", "GET", "/v2/_catalog?n=x", nil, 400, codeUnsupported, nil, nil},

		// Manifests.
		{"manifest by tag", "GET", app + "/manifests/1.2", nil, 200, "", map[string]string{
			"Content-Type": "application/vnd.oci.image.manifest.v1+json", "Docker-Content-Digest": f.appDigest.String(),
			"Content-Length": strconv.Itoa(len(appRaw))}, bodyIs(appRaw)},
		{"manifest HEAD", "HEAD", app + "/manifests/latest", nil, 200, "", map[string]string{
			"Docker-Content-Digest": f.appDigest.String(), "Content-Length": strconv.Itoa(len(appRaw))}, bodyIs(nil)},
		{"manifest by digest", "GET", app + "/manifests/" + f.appDigest.String(), nil, 200, "", nil, bodyIs(appRaw)},
		{"manifest escaped colon", "GET", app + "/manifests/" + strings.Replace(f.appDigest.String(), ":", "%3A", 1), nil, 200, "", nil, bodyIs(appRaw)},
		{"index by tag", "GET", "/v2/quay.io/acme/multi/manifests/1.0", nil, 200, "", map[string]string{
			"Content-Type": "application/vnd.oci.image.index.v1+json", "Docker-Content-Digest": f.multiDigest.String()}, bodyIs(multiRaw)},
		{"index child by digest", "GET", "/v2/quay.io/acme/multi/manifests/" + child.String(), nil, 200, "", map[string]string{"Docker-Content-Digest": child.String()}, nil},
		{"index child in other repo", "GET", app + "/manifests/" + child.String(), nil, 404, codeManifestUnknown, nil, nil},
		{"digest of other repo", "GET", "/v2/quay.io/acme/multi/manifests/" + f.appDigest.String(), nil, 404, codeManifestUnknown, nil, nil},
		{"digest-only name", "GET", "/v2/quay.io/acme/pinned/manifests/" + f.pinnedDigest.String(), nil, 200, "", nil, nil},
		{"docker hub name", "GET", "/v2/docker.io/library/busybox/manifests/1.36", nil, 200, "", map[string]string{
			"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"}, bodyIs(busyRaw)},
		{"referrer in subject's repo", "GET", app + "/manifests/" + f.sbomDigest.String(), nil, 200, "", nil, nil},
		{"bare-tag entry not served", "GET", app + "/manifests/" + f.bareTagDigest.String(), nil, 404, codeManifestUnknown, nil, nil},
		{"unknown tag", "GET", app + "/manifests/9.9", nil, 404, codeManifestUnknown, nil, nil},
		{"unknown tag HEAD", "HEAD", app + "/manifests/9.9", nil, 404, "", nil, bodyIs(nil)},
		{"unknown repo", "GET", "/v2/quay.io/acme/nope/manifests/1.2", nil, 404, codeNameUnknown, nil, nil},
		// Audit row 1: a reference that is not a tag names no manifest: 404.
		{"invalid tag", "GET", app + "/manifests/-bad", nil, 404, codeManifestUnknown, nil, nil},
		{"invalid tag (conformance suite)", "GET", app + "/manifests/.INVALID_MANIFEST_NAME", nil, 404, codeManifestUnknown, nil, nil},
		{"invalid tag HEAD", "HEAD", app + "/manifests/.INVALID_MANIFEST_NAME", nil, 404, "", nil, bodyIs(nil)},
		{"malformed digest", "GET", app + "/manifests/sha256:totallywrong", nil, 400, codeDigestInvalid, nil, nil},
		{"sha512 manifest not here", "GET", app + "/manifests/sha512:" + strings.Repeat("a", 128), nil, 404, codeManifestUnknown, nil, nil},
		{"uppercase digest", "GET", app + "/manifests/sha256:" + strings.ToUpper(f.appDigest.Hex), nil, 400, codeDigestInvalid, nil, nil},
		{"short digest", "GET", app + "/manifests/sha256:abc", nil, 400, codeDigestInvalid, nil, nil},
		{"other algorithm", "GET", app + "/blobs/sha512:" + strings.Repeat("a", 128), nil, 404, codeBlobUnknown, nil, nil},
		{"unknown algorithm", "GET", app + "/blobs/md5:" + strings.Repeat("a", 32), nil, 400, codeDigestInvalid, nil, nil},

		// Blobs.
		{"blob", "GET", app + "/blobs/" + cfg.Digest.String(), nil, 200, "", map[string]string{
			"Content-Type": "application/octet-stream", "Docker-Content-Digest": cfg.Digest.String(),
			"Content-Length": strconv.Itoa(len(cfgBytes)), "Accept-Ranges": "bytes"}, bodyIs(cfgBytes)},
		{"blob HEAD", "HEAD", app + "/blobs/" + layer.Digest.String(), nil, 200, "", map[string]string{
			"Content-Length": strconv.FormatInt(layer.Size, 10)}, bodyIs(nil)},
		{"manifest as blob", "GET", app + "/blobs/" + f.appDigest.String(), nil, 200, "", nil, bodyIs(appRaw)},
		{"range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=0-9"}, 206, "", map[string]string{
			"Content-Range": fmt.Sprintf("bytes 0-9/%d", len(cfgBytes)), "Content-Length": "10"}, bodyIs(cfgBytes[:10])},
		{"suffix range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=-5"}, 206, "", nil, bodyIs(cfgBytes[len(cfgBytes)-5:])},
		{"open range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=7-"}, 206, "", nil, bodyIs(cfgBytes[7:])},
		{"range past end", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": fmt.Sprintf("bytes=%d-", len(cfgBytes))}, 416, codeRangeInvalid,
			map[string]string{"Content-Range": fmt.Sprintf("bytes */%d", len(cfgBytes)), "Content-Type": "application/json"}, nil},
		{"malformed range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=z-1"}, 416, codeRangeInvalid, nil, nil},
		{"huge range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=0-99999999999999999999999"}, 416, codeRangeInvalid, nil, nil},
		// Audit rows 2 and 3: no satisfiable range is a 416; ranges are bounded.
		{"suffix range -0", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=-0"}, 416, codeRangeInvalid,
			map[string]string{"Content-Range": fmt.Sprintf("bytes */%d", len(cfgBytes))}, nil},
		{"suffix range -0 HEAD", "HEAD", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=-0"}, 416, "", nil, bodyIs(nil)},
		{"manifest range -0", "GET", app + "/manifests/1.2", map[string]string{"Range": "bytes=-0"}, 416, codeRangeInvalid, nil, nil},
		{"-0 beside a good range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=-0, 0-1"}, 206, "",
			map[string]string{"Content-Range": fmt.Sprintf("bytes 0-1/%d", len(cfgBytes))}, bodyIs(cfgBytes[:2])},
		{"signed position", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=+1-2"}, 416, codeRangeInvalid, nil, nil},
		{"last before first", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=5-2"}, 416, codeRangeInvalid, nil, nil},
		{"other unit", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "items=0-1"}, 416, codeRangeInvalid, nil, nil},
		{"16 ranges", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": oneByteRanges(maxRanges)}, 206, "", nil, multipart},
		{"17 ranges", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": oneByteRanges(maxRanges + 1)}, 416, codeRangeInvalid, nil, nil},
		{"5000 ranges", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": oneByteRanges(5000)}, 416, codeRangeInvalid, nil,
			func(t *testing.T, _ map[string][]string, body []byte) {
				if len(body) > 1024 {
					t.Errorf("a 5000-range request got a %d byte answer", len(body))
				}
			}},
		{"stale If-Range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=0-1", "If-Range": `"sha256:old"`}, 200, "", nil, bodyIs(cfgBytes)},
		{"current If-Range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=0-1", "If-Range": `"` + cfg.Digest.String() + `"`}, 206, "", nil, bodyIs(cfgBytes[:2])},
		{"multi range", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=0-1,4-5"}, 206, "", nil, multipart},
		{"overlapping ranges larger than blob", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"Range": "bytes=0-,0-,0-"}, 200, "", nil, bodyIs(cfgBytes)},
		{"conditional", "GET", app + "/blobs/" + cfg.Digest.String(), map[string]string{"If-None-Match": `"` + cfg.Digest.String() + `"`}, 304, "", nil, bodyIs(nil)},
		{"blob of other repo", "GET", app + "/blobs/" + childLayer.String(), nil, 404, codeBlobUnknown, nil, nil},
		{"index child blob", "GET", "/v2/quay.io/acme/multi/blobs/" + childLayer.String(), nil, 200, "", nil, nil},
		{"unknown blob", "GET", app + "/blobs/" + zero, nil, 404, codeBlobUnknown, nil, nil},
		{"unknown blob HEAD", "HEAD", app + "/blobs/" + zero, nil, 404, "", nil, bodyIs(nil)},
		{"blob unknown repo", "GET", "/v2/quay.io/x/y/blobs/" + zero, nil, 404, codeNameUnknown, nil, nil},

		// Tags.
		{"tags", "GET", app + "/tags/list", nil, 200, "", nil, jsonIs(`{"name":"quay.io/acme/app","tags":["1.2","latest"]}`)},
		{"tags n=1", "GET", app + "/tags/list?n=1", nil, 200, "", map[string]string{"Link": `</v2/quay.io/acme/app/tags/list?n=1&last=1.2>; rel="next"`},
			jsonIs(`{"name":"quay.io/acme/app","tags":["1.2"]}`)},
		{"tags n=1 last", "GET", app + "/tags/list?n=1&last=1.2", nil, 200, "", map[string]string{"Link": ""}, jsonIs(`{"name":"quay.io/acme/app","tags":["latest"]}`)},
		{"tags none", "GET", "/v2/quay.io/acme/pinned/tags/list", nil, 200, "", nil, jsonIs(`{"name":"quay.io/acme/pinned","tags":[]}`)},
		{"tags unknown repo", "GET", "/v2/quay.io/acme/nope/tags/list", nil, 404, codeNameUnknown, nil, nil},

		// Referrers.
		{"referrers", "GET", app + "/referrers/" + f.appDigest.String(), nil, 200, "", map[string]string{
			"Content-Type": "application/vnd.oci.image.index.v1+json", "OCI-Filters-Applied": ""}, referrers(f.sbomDigest, f.sigDigest)},
		{"referrers filtered", "GET", app + "/referrers/" + f.appDigest.String() + "?artifactType=" + url.QueryEscape(sbomType), nil, 200, "", map[string]string{
			"OCI-Filters-Applied": "artifactType"}, referrers(f.sbomDigest)},
		{"referrers none", "GET", app + "/referrers/" + zero, nil, 200, "", nil, referrers()},
		{"referrers other repo", "GET", "/v2/quay.io/acme/multi/referrers/" + f.appDigest.String(), nil, 200, "", nil, referrers()},
		{"referrers bad digest", "GET", app + "/referrers/latest", nil, 400, codeDigestInvalid, nil, nil},

		// Hostile paths: rejected as NAME_INVALID before any lookup.
		{"dot-dot", "GET", "/v2/quay.io/../../etc/manifests/1.2", nil, 400, codeNameInvalid, nil, nil},
		{"dot", "GET", "/v2/quay.io/./app/manifests/1.2", nil, 400, codeNameInvalid, nil, nil},
		{"encoded slash", "GET", "/v2/quay.io/acme%2Fapp/manifests/1.2", nil, 400, codeNameInvalid, nil, nil},
		{"encoded dot-dot", "GET", "/v2/quay.io/%2e%2e/%2e%2e/blobs/" + zero, nil, 400, codeNameInvalid, nil, nil},
		{"backslash", "GET", `/v2/quay.io/acme\app/manifests/1.2`, nil, 400, codeNameInvalid, nil, nil},
		{"NUL", "GET", "/v2/quay.io/acme/app%00/manifests/1.2", nil, 400, codeNameInvalid, nil, nil},
		{"empty component", "GET", "/v2/quay.io//app/manifests/1.2", nil, 400, codeNameInvalid, nil, nil},
		{"no host", "GET", "/v2/app/manifests/1.2", nil, 404, codeNameUnknown, nil, nil}, // spec-valid name: not here
		{"no host, bad name", "GET", "/v2/App/manifests/1.2", nil, 400, codeNameInvalid, nil, nil},
		{"uppercase", "GET", "/v2/quay.io/Acme/app/manifests/1.2", nil, 400, codeNameInvalid, nil, nil},
		{"digest traversal", "GET", app + "/blobs/..%2F..%2Fetc%2Fpasswd", nil, 400, codeDigestInvalid, nil, nil},
		{"no endpoint", "GET", app + "/things/x", nil, 404, codeNameUnknown, nil, nil},
		{"outside /v2", "GET", "/etc/passwd", nil, 404, codeNameUnknown, nil, nil},

		// Writes: all refused.
		{"start upload", "POST", app + "/blobs/uploads/", nil, 405, codeUnsupported, map[string]string{"Allow": "GET, HEAD"}, nil},
		{"mount", "POST", app + "/blobs/uploads/?mount=" + zero + "&from=quay.io/acme/multi", nil, 405, codeUnsupported, nil, nil},
		{"patch upload", "PATCH", app + "/blobs/uploads/123", nil, 405, codeUnsupported, nil, nil},
		{"put upload", "PUT", app + "/blobs/uploads/123?digest=" + zero, nil, 405, codeUnsupported, nil, nil},
		{"put manifest", "PUT", app + "/manifests/1.2", nil, 405, codeUnsupported, nil, nil},
		{"delete manifest", "DELETE", app + "/manifests/" + f.appDigest.String(), nil, 405, codeUnsupported, nil, nil},
		{"delete blob", "DELETE", app + "/blobs/" + cfg.Digest.String(), nil, 405, codeUnsupported, nil, nil},
		{"options", "OPTIONS", "/v2/", nil, 405, codeUnsupported, nil, nil},
		{"put bad digest", "PUT", app + "/manifests/sha256:totallywrong", nil, 400, codeDigestInvalid, nil, nil},
		{"put invalid tag", "PUT", app + "/manifests/.INVALID_MANIFEST_NAME", nil, 405, codeUnsupported, nil, nil},
		{"put bad name", "PUT", "/v2/quay.io/../x/manifests/1", nil, 400, codeNameInvalid, nil, nil},
		{"put no endpoint", "PUT", "/v2/quay.io/acme/app/things/x", nil, 405, codeUnsupported, nil, nil},
		{"upload route GET", "GET", app + "/blobs/uploads/", nil, 405, codeUnsupported, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, tc.method, base+tc.path, tc.reqHdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("%s %s: status %d, want %d; body %.300s", tc.method, tc.path, resp.StatusCode, tc.status, body)
			}
			if got := resp.Header.Get("Docker-Distribution-API-Version"); got != "registry/2.0" {
				t.Errorf("Docker-Distribution-API-Version = %q", got)
			}
			if tc.code != "" {
				if got := apiErrorCode(body); got != tc.code {
					t.Errorf("error code %q, want %q; body %s", got, tc.code, body)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("error Content-Type %q", ct)
				}
			}
			for k, v := range tc.hdr {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if tc.check != nil {
				tc.check(t, resp.Header, body)
			}
		})
	}
}

// oneByteRanges is a Range header asking for bytes 0, 2, 4, … (n ranges).
func oneByteRanges(n int) string {
	specs := make([]string, n)
	for i := range specs {
		specs[i] = fmt.Sprintf("%d-%d", 2*i, 2*i)
	}
	return "bytes=" + strings.Join(specs, ",")
}
