package registry

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error codes of the OCI distribution spec (and RANGE_INVALID from the
// Docker registry API, which clients also know, for a 416).
const (
	codeBlobUnknown     = "BLOB_UNKNOWN"
	codeManifestUnknown = "MANIFEST_UNKNOWN"
	codeNameInvalid     = "NAME_INVALID"
	codeNameUnknown     = "NAME_UNKNOWN"
	codeDigestInvalid   = "DIGEST_INVALID"
	codeRangeInvalid    = "RANGE_INVALID"
	codeUnsupported     = "UNSUPPORTED"
	codeUnknown         = "UNKNOWN"
)

// apiError is one error response: HTTP status plus the spec's JSON body.
type apiError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func newError(status int, code, msg string) *apiError {
	return &apiError{Status: status, Code: code, Message: msg}
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

var errNotFound = newError(http.StatusNotFound, codeNameUnknown, "no such endpoint or repository")

// write sends the error as {"errors":[{code,message}]}.
func (e *apiError) write(w http.ResponseWriter) {
	body, _ := json.Marshal(struct {
		Errors []*apiError `json:"errors"`
	}{[]*apiError{e}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Del("Docker-Content-Digest")
	h.Del("Accept-Ranges")
	h.Del("Etag")
	w.WriteHeader(e.Status)
	w.Write(body)
}
