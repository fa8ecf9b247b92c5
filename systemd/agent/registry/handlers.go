package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func writeJSON(w http.ResponseWriter, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// manifest serves a manifest's exact bytes, by tag or by digest. A digest
// must belong to the repository (its tagged manifests, their children and
// referrers); the same content under another name is MANIFEST_UNKNOWN.
func (s *Server) manifest(w http.ResponseWriter, r *http.Request, repo *repository, rt route) {
	digest := rt.ref
	if !strings.Contains(rt.ref, ":") { // a tag (parseRoute checked which)
		var ok bool
		if digest, ok = repo.tags[rt.ref]; !ok {
			newError(http.StatusNotFound, codeManifestUnknown, fmt.Sprintf("tag %s:%s is not on this node", rt.name, rt.ref)).write(w)
			return
		}
	}
	if manifests, _ := s.ix.members(repo); !manifests[digest] {
		newError(http.StatusNotFound, codeManifestUnknown, fmt.Sprintf("manifest %s@%s is not on this node", rt.name, digest)).write(w)
		return
	}
	m := s.ix.manifests[digest]
	data, err := s.ix.bytes(m)
	if err != nil {
		// From a prebuilt index, read now for the first time: answered as a
		// damaged blob is (500, never wrong bytes), and logged each time.
		bf, _ := s.ix.blob(digest)
		s.damaged(w, digest, bf, "manifest: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", m.mediaType)
	s.serveContent(w, r, digest, int64(len(data)), bytes.NewReader(data))
}

// blob streams a blob from its file: Range, HEAD and conditional requests
// via http.ServeContent, the body copied out through a buffer (copyBody). The size check against
// the descriptor catches a truncated or grown file before any byte is sent;
// a file that shrinks while being sent aborts the connection; the first
// full read of each blob is hashed (verifyingReader), later ones are not.
func (s *Server) blob(w http.ResponseWriter, r *http.Request, repo *repository, rt route) {
	if _, blobs := s.ix.members(repo); !blobs[rt.ref] {
		newError(http.StatusNotFound, codeBlobUnknown, fmt.Sprintf("blob %s is not in repository %s on this node", rt.ref, rt.name)).write(w)
		return
	}
	bf, _ := s.ix.blob(rt.ref)
	if bf.path == "" {
		// A release lists it but neither the store nor the partition has it.
		s.log.Error("blob is "+bf.missing+": not served; roll the release back (kiln agent release rollback VERSION) and plug its stick in again",
			"digest", rt.ref, "repository", rt.name)
		newError(http.StatusNotFound, codeBlobUnknown, fmt.Sprintf("blob %s of repository %s is missing on this node", rt.ref, rt.name)).write(w)
		return
	}
	f, err := openRegular(bf.path)
	if errors.Is(err, errNotRegular) {
		// A symlink could point anywhere on the node: never followed.
		s.log.Error("blob file is not a regular file: not served; "+damageFix(bf.store),
			"file", bf.path, "digest", rt.ref, "error", err)
		newError(http.StatusNotFound, codeBlobUnknown, fmt.Sprintf("blob %s is not in repository %s on this node", rt.ref, rt.name)).write(w)
		return
	}
	if bf.store && errors.Is(err, os.ErrNotExist) {
		// Collected since the start: its release is no longer kept.
		s.log.Warn("blob left the release store since the registry started (its release was retired): not served", "file", bf.path, "digest", rt.ref)
		newError(http.StatusNotFound, codeBlobUnknown, fmt.Sprintf("blob %s is not in repository %s on this node", rt.ref, rt.name)).write(w)
		return
	}
	if err != nil {
		s.damaged(w, rt.ref, bf, err.Error())
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		s.damaged(w, rt.ref, bf, err.Error())
		return
	}
	if fi.Size() != bf.size {
		s.damaged(w, rt.ref, bf, fmt.Sprintf("file is %d bytes, descriptor says %d", fi.Size(), bf.size))
		return
	}
	var content io.ReadSeeker = f
	switch v, _ := s.verified.Load(rt.ref); v {
	case false:
		s.damaged(w, rt.ref, bf, "content does not match its digest (found on an earlier read)")
		return
	case nil:
		// First full read: hash it on the way (not hashed from the next read on).
		if r.Method == http.MethodGet && r.Header.Get("Range") == "" {
			content = &verifyingReader{f: f, s: s, digest: rt.ref, bf: bf, h: sha256.New()}
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	s.serveContent(w, r, rt.ref, bf.size, content)
}

// verifyingReader hashes a blob as it is sent in full for the first time.
// The check runs before the last bytes are handed on: a blob that does not
// match its digest never reaches the client complete; the connection is
// aborted instead, and the blob is marked damaged for later requests.
//
// It hides the *os.File (no embedding) so nothing can send the file past it.
type verifyingReader struct {
	f      *os.File
	s      *Server
	digest string
	bf     blobFile
	h      hash.Hash
	pos    int64
}

func (v *verifyingReader) Seek(off int64, whence int) (int64, error) {
	pos, err := v.f.Seek(off, whence)
	v.pos = pos
	if pos == 0 {
		v.h.Reset()
	}
	return pos, err
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	start := v.pos
	n, err := v.f.Read(p)
	if err != nil && err != io.EOF {
		// Through dm-verity a changed block reads as EIO: the partition
		// refused bytes it did not build, so the blob is damaged.
		v.s.verified.Store(v.digest, false)
		v.s.log.Error("blob file damaged: unreadable (through dm-verity, a changed block of the image partition reads as an I/O error); verify the image partition with `kiln verify` or reflash it",
			"file", v.bf.path, "digest", v.digest, "offset", v.pos, "error", err.Error())
		panic(http.ErrAbortHandler)
	}
	v.h.Write(p[:n])
	v.pos += int64(n)
	if start < v.bf.size && v.pos == v.bf.size {
		got := "sha256:" + hex.EncodeToString(v.h.Sum(nil))
		if got != v.digest {
			v.s.verified.Store(v.digest, false)
			v.s.log.Error("blob file damaged: content does not match its digest; verify the image partition with `kiln verify` or reflash it",
				"file", v.bf.path, "digest", v.digest, "got", got)
			panic(http.ErrAbortHandler)
		}
		v.s.verified.Store(v.digest, true)
	}
	return n, err
}

// damaged reports a blob the index knows but whose file is wrong: 500 to
// the client (never wrong bytes), and a log line a technician can act on.
func (s *Server) damaged(w http.ResponseWriter, digest string, bf blobFile, why string) {
	s.log.Error("blob file damaged: "+damageFix(bf.store), "file", bf.path, "digest", digest, "problem", why)
	newError(http.StatusInternalServerError, codeUnknown, "blob "+digest+" is damaged on this node: "+damageFix(bf.store)).write(w)
}

// serveContent sends content (size bytes) with Docker-Content-Digest and an
// ETag. It checks the Range header first (checkRange), gives the client
// writeTimeout to take each chunk of the body, and aborts the connection if
// fewer bytes went out than were promised.
func (s *Server) serveContent(w http.ResponseWriter, r *http.Request, digest string, size int64, content io.ReadSeeker) {
	h := w.Header()
	h.Set("Docker-Content-Digest", digest)
	h.Set("Etag", `"`+digest+`"`)
	if ir := r.Header.Get("If-Range"); ir != "" && ir != h.Get("Etag") {
		r.Header.Del("Range") // the client's copy is stale: it gets the whole blob
	}
	if rg := r.Header.Get("Range"); rg != "" {
		checked, aerr := checkRange(rg, size)
		if aerr != nil {
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			aerr.write(w)
			return
		}
		r.Header.Set("Range", checked)
	}
	bw := &contentWriter{ResponseWriter: w, timeout: s.writeTimeout, rc: http.NewResponseController(w)}
	http.ServeContent(bw, r, "", time.Time{}, content)
	if r.Method == http.MethodHead || bw.rangeErr || (bw.status != http.StatusOK && bw.status != http.StatusPartialContent) {
		return
	}
	if bw.err != nil && errors.Is(bw.err, os.ErrDeadlineExceeded) {
		s.log.Warn("client took no data for the write timeout; closing its connection",
			"digest", digest, "sent", bw.n, "timeout", s.writeTimeout, "client", r.RemoteAddr)
		panic(http.ErrAbortHandler)
	}
	if want, err := strconv.ParseInt(h.Get("Content-Length"), 10, 64); err == nil && bw.n != want && bw.err == nil {
		s.log.Error("blob ended early while being sent: the image partition is damaged; verify it with `kiln verify` or reflash it",
			"digest", digest, "sent", bw.n, "want", want)
		panic(http.ErrAbortHandler) // the client must see a broken transfer, not a short body
	}
}

// sendChunk is how much of a body goes out per write deadline: a client
// that cannot take sendChunk bytes within the write timeout is cut off.
const sendChunk = 4 << 20

// contentWriter wraps http.ServeContent's writer: it counts body bytes
// (ServeContent's copy comes through ReadFrom), gives each chunk of the
// body a fresh write deadline, and replaces ServeContent's plain text 416
// with the spec's JSON error.
type contentWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	status   int
	n        int64
	err      error // first write error (a client gone or too slow)
	rangeErr bool
}

func (c *contentWriter) WriteHeader(status int) {
	if c.status != 0 {
		return
	}
	c.status = status
	if status == http.StatusRequestedRangeNotSatisfiable {
		c.rangeErr = true
		newError(status, codeRangeInvalid, "requested range not satisfiable: "+c.Header().Get("Content-Range")).write(c.ResponseWriter)
		return
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *contentWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.rangeErr {
		return len(b), nil
	}
	c.rc.SetWriteDeadline(time.Now().Add(c.timeout))
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	c.noteErr(err)
	return n, err
}

// ReadFrom sends src in chunks of sendChunk, each with a fresh write
// deadline.
func (c *contentWriter) ReadFrom(src io.Reader) (int64, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.rangeErr {
		return io.Copy(io.Discard, src)
	}
	var total int64
	for {
		chunk := &io.LimitedReader{R: src, N: sendChunk}
		lr, limited := src.(*io.LimitedReader)
		if limited {
			chunk = &io.LimitedReader{R: lr.R, N: min(lr.N, sendChunk)}
		}
		want := chunk.N
		c.rc.SetWriteDeadline(time.Now().Add(c.timeout))
		n, err := copyBody(c.ResponseWriter, chunk)
		total += n
		c.n += n
		if limited {
			lr.N -= n
		}
		c.noteErr(err)
		if err != nil || n < want || (limited && lr.N == 0) {
			return total, err
		}
	}
}

func (c *contentWriter) noteErr(err error) {
	if c.err == nil {
		c.err = err
	}
}

// sendBuffer is what a body is copied through on its way out. Not
// sendfile(2): over loopback, where every client of this registry is, one
// client gets 2,640 MiB/s from a server writing 1 MiB at a time from user
// space and 2,124 MiB/s from one sending the file by sendfile, and eight
// clients get the same from both (BENCHMARKS.md, "kiln serve: the blob
// ceiling"). One buffer per body being sent.
var sendBuffers = sync.Pool{New: func() any { b := make([]byte, sendBufferSize); return &b }}

const sendBufferSize = 1 << 20

// copyBody copies src to w through a sendBuffer (hiding w's ReadFrom and
// src's WriteTo, which would sendfile).
func copyBody(w io.Writer, src io.Reader) (int64, error) {
	bp := sendBuffers.Get().(*[]byte)
	defer sendBuffers.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{src}, *bp)
}

// readFrom copies src to w through w's own ReadFrom when it has one (so a
// file goes out by sendfile), hiding any other method of w from io.Copy.
func readFrom(w http.ResponseWriter, src io.Reader) (int64, error) {
	if rf, ok := w.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(struct{ io.Writer }{w}, src)
}

// page applies the spec's n/last pagination to a list in lexicalOrder. It returns the
// page and, when more follow, the query of the next page's Link.
func page(all []string, q url.Values) (items []string, next string, aerr *apiError) {
	start := 0
	if last := q.Get("last"); last != "" {
		start = sort.Search(len(all), func(i int) bool { return lexicalOrder(all[i], last) >= 0 })
		if start < len(all) && all[start] == last {
			start++
		}
	}
	items = all[start:]
	if ns := q.Get("n"); ns != "" {
		n, err := strconv.Atoi(ns)
		if err != nil || n < 0 {
			return nil, "", newError(http.StatusBadRequest, codeUnsupported, "n must be a non-negative integer")
		}
		if n < len(items) {
			items = items[:n]
			if n > 0 {
				next = "n=" + ns + "&last=" + url.QueryEscape(items[n-1])
			}
		}
	}
	if items == nil {
		items = []string{}
	}
	return items, next, nil
}

func (s *Server) tags(w http.ResponseWriter, r *http.Request, repo *repository, rt route) {
	items, next, aerr := page(repo.tagList, r.URL.Query())
	if aerr != nil {
		aerr.write(w)
		return
	}
	if next != "" {
		w.Header().Set("Link", fmt.Sprintf(`</v2/%s/tags/list?%s>; rel="next"`, rt.name, next))
	}
	body, _ := json.Marshal(struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}{rt.name, items})
	writeJSON(w, "application/json", body)
}

func (s *Server) catalog(w http.ResponseWriter, r *http.Request) {
	items, next, aerr := page(s.ix.repoList, r.URL.Query())
	if aerr != nil {
		aerr.write(w)
		return
	}
	if next != "" {
		w.Header().Set("Link", fmt.Sprintf(`</v2/_catalog?%s>; rel="next"`, next))
	}
	body, _ := json.Marshal(struct {
		Repositories []string `json:"repositories"`
	}{items})
	writeJSON(w, "application/json", body)
}

// referrers lists the manifests whose subject is the given digest, within
// the repository, as an OCI image index (empty when there are none).
func (s *Server) referrers(w http.ResponseWriter, r *http.Request, repo *repository, rt route) {
	at := r.URL.Query().Get("artifactType")
	if at != "" {
		w.Header().Set("OCI-Filters-Applied", "artifactType")
	}
	writeJSON(w, ocispec.MediaTypeImageIndex, s.ix.referrersIndex(repo, rt.ref, at))
}
