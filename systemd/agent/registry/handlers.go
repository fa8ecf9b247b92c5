package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
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
	w.Header().Set("Content-Type", m.MediaType)
	s.serveContent(w, r, body{digest: digest, size: int64(len(data)), content: bytes.NewReader(data)})
}

// blob streams a blob from its file: Range, HEAD and conditional requests
// via http.ServeContent, the body copied out through a buffer (copyBody). The size check against
// the descriptor catches a truncated or grown file before any byte is sent;
// a file that shrinks while being sent aborts the connection; no byte goes
// out that was not checked against the digest (checkedContent).
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
	f, err := inputfile.OpenFile(bf.path, inputfile.NoFollow())
	if errors.Is(err, inputfile.ErrNotFile) {
		// A symlink could point anywhere on the node: never followed.
		s.log.Error("blob file is not a regular file: not served; "+regindex.DamageFix(bf.store),
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
	dropStaleRange(r, rt.ref)
	content, final, ok := s.checkedContent(w, r, rt.ref, bf, f)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	s.serveContent(w, r, body{digest: rt.ref, size: bf.size, content: content, final: final})
}

// checkedContent checks blob digest's file f against the descriptor's size
// and returns what to send of it so that no byte leaves unchecked
// (check.go), and a check to make before the body's last byte goes out (nil
// for none). It answers the request itself and returns false when the blob
// is known to be damaged.
func (s *Server) checkedContent(w http.ResponseWriter, r *http.Request, digest string, bf blobFile, f *os.File) (io.ReadSeeker, func() error, bool) {
	fi, err := f.Stat()
	if err != nil {
		s.damaged(w, digest, bf, err.Error())
		return nil, nil, false
	}
	if fi.Size() != bf.size {
		s.damaged(w, digest, bf, fmt.Sprintf("file is %d bytes, descriptor says %d", fi.Size(), bf.size))
		return nil, nil, false
	}
	st := stampOf(fi)
	tr := s.trust.of(f, st.dev)
	// Written a moment ago: a write in the same clock tick could leave the
	// stamp unmoved. Once the window is out, any write moves it.
	for i := 0; tr == stamped && st.racyFor(time.Now()) > 0; i++ {
		if i == 3 {
			tr = hashEveryRead // still being written
			break
		}
		time.Sleep(st.racyFor(time.Now()))
		fi, err := f.Stat()
		if err != nil {
			s.damaged(w, digest, bf, err.Error())
			return nil, nil, false
		}
		if st = stampOf(fi); st.size != bf.size {
			s.damaged(w, digest, bf, fmt.Sprintf("file is %d bytes, descriptor says %d", st.size, bf.size))
			return nil, nil, false
		}
	}
	c, known := s.checkOf(digest)
	if known && c.stamp != st {
		s.log.Warn("blob file changed since it was checked: it is checked again before it is served", "file", bf.path, "digest", digest)
		known = false
	}
	ranged := r.Header.Get("Range") != ""
	switch {
	case known && tr != hashEveryRead && !c.ok:
		s.damaged(w, digest, bf, "content does not match its digest (found on an earlier read)")
		return nil, nil, false
	case known && tr == verity:
		return f, nil, true
	case known && tr == stamped:
		return f, s.unchanged(f, st, digest, bf), true
	case r.Method == http.MethodHead:
		return f, nil, true // no byte of the blob goes out
	case ranged && tr == verity:
		return f, nil, true // the build's bytes, which the factory checked
	case ranged && tr == stamped:
		if _, aerr := checkRange(r.Header.Get("Range"), bf.size); aerr != nil {
			return f, nil, true // answered 416 by serveContent, no byte sent
		}
		ok, err := s.hashFirst(f, st, digest, bf)
		if err != nil || !ok {
			why := "content does not match its digest"
			if err != nil {
				why = "unreadable: " + err.Error()
			}
			s.damaged(w, digest, bf, why)
			return nil, nil, false
		}
		return f, s.unchanged(f, st, digest, bf), true
	}
	// The whole blob, hashed on its way out. A Range where no check can be
	// kept (hashEveryRead) is answered with the whole blob too, as RFC
	// 9110 allows: only a whole blob can be hashed as it is sent.
	r.Header.Del("Range")
	return &verifyingReader{f: f, s: s, digest: digest, bf: bf, h: sha256.New(), stamp: st, keep: tr != hashEveryRead}, nil, true
}

// checkOf returns the last check of blob digest, if any.
func (s *Server) checkOf(digest string) (check, bool) {
	v, ok := s.checks.Load(digest)
	if !ok {
		return check{}, false
	}
	return v.(check), true
}

// hashFirst hashes blob digest's file before a Range of it is served, once
// for all the requests that ask at the same time, and keeps the result.
func (s *Server) hashFirst(f *os.File, st fileStamp, digest string, bf blobFile) (bool, error) {
	key := fmt.Sprintf("%s %d:%d %d.%d", digest, st.dev, st.ino, st.ctime.Sec, st.ctime.Nsec)
	v, err, _ := s.hashing.Do(key, func() (any, error) {
		ok, err := hashFile(f, bf.size, digest)
		if err == nil {
			s.checks.Store(digest, check{stamp: st, ok: ok})
		}
		return ok, err
	})
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// unchanged is the check before a checked blob's last byte goes out: its
// file must still have the stamp it was checked with, or a write since may
// have changed what was sent. A change cuts the connection (the client
// never holds the whole blob) and is logged; the next request checks the
// file again.
func (s *Server) unchanged(f *os.File, st fileStamp, digest string, bf blobFile) func() error {
	return func() error {
		fi, err := f.Stat()
		if err == nil && stampOf(fi) == st {
			return nil
		}
		s.log.Error("blob file changed while it was being sent: connection closed before its last byte; it is checked again on the next request",
			"file", bf.path, "digest", digest)
		return errChanged
	}
}

var errChanged = errors.New("blob file changed while it was being sent")

// dropStaleRange removes the Range of a request whose If-Range does not
// name digest: the client's copy is stale and it gets the whole blob.
func dropStaleRange(r *http.Request, digest string) {
	if ir := r.Header.Get("If-Range"); ir != "" && ir != `"`+digest+`"` {
		r.Header.Del("Range")
	}
}

// verifyingReader hashes a blob as it is sent in full. The check runs
// before the last bytes are handed on: a blob that does not match its
// digest never reaches the client complete; the connection is aborted
// instead. With keep, the result is kept for later requests (bound to the
// file's stamp when the read began).
//
// It hides the *os.File (no embedding) so nothing can send the file past it.
type verifyingReader struct {
	f      *os.File
	s      *Server
	digest string
	bf     blobFile
	h      hash.Hash
	pos    int64
	stamp  fileStamp
	keep   bool
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
		v.record(false)
		v.s.log.Error("blob file damaged: unreadable (through dm-verity, a changed block of the image partition reads as an I/O error); "+regindex.DamageFix(v.bf.store),
			"file", v.bf.path, "digest", v.digest, "offset", v.pos, "error", err.Error())
		panic(http.ErrAbortHandler)
	}
	v.h.Write(p[:n])
	v.pos += int64(n)
	if start < v.bf.size && v.pos == v.bf.size {
		got := digest.NewDigest(digest.SHA256, v.h).String()
		if got != v.digest {
			v.record(false)
			v.s.log.Error("blob file damaged: content does not match its digest; "+regindex.DamageFix(v.bf.store),
				"file", v.bf.path, "digest", v.digest, "got", got)
			panic(http.ErrAbortHandler)
		}
		v.record(true)
	}
	return n, err
}

func (v *verifyingReader) record(ok bool) {
	if v.keep {
		v.s.checks.Store(v.digest, check{stamp: v.stamp, ok: ok})
	}
}

// damaged reports a blob the index knows but whose file is wrong: 500 to
// the client (never wrong bytes), and a log line a technician can act on.
func (s *Server) damaged(w http.ResponseWriter, digest string, bf blobFile, why string) {
	s.log.Error("blob file damaged: "+regindex.DamageFix(bf.store), "file", bf.path, "digest", digest, "problem", why)
	newError(http.StatusInternalServerError, codeUnknown, "blob "+digest+" is damaged on this node: "+regindex.DamageFix(bf.store)).write(w)
}

// body is what serveContent sends: the size bytes of content, blob or
// manifest digest, and a check to make before its last byte goes out (nil:
// none).
type body struct {
	digest  string
	size    int64
	content io.ReadSeeker
	final   func() error
}

// serveContent sends b with Docker-Content-Digest and an ETag. It checks
// the Range header first (checkRange), gives the client writeTimeout to
// take each chunk of the body, and aborts the connection if fewer bytes
// went out than were promised.
func (s *Server) serveContent(w http.ResponseWriter, r *http.Request, b body) {
	digest, size, content, final := b.digest, b.size, b.content, b.final
	h := w.Header()
	h.Set("Docker-Content-Digest", digest)
	h.Set("Etag", `"`+digest+`"`)
	dropStaleRange(r, digest)
	if rg := r.Header.Get("Range"); rg != "" {
		checked, aerr := checkRange(rg, size)
		if aerr != nil {
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			aerr.write(w)
			return
		}
		r.Header.Set("Range", checked)
	}
	bw := &contentWriter{ResponseWriter: w, timeout: s.writeTimeout, rc: http.NewResponseController(w), final: final, want: -1}
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
// body a fresh write deadline, holds the body's last byte back until final
// passes, and replaces ServeContent's plain text 416 with the spec's JSON
// error.
type contentWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	status   int
	n        int64
	want     int64        // the body's Content-Length, -1 until known
	final    func() error // run before the last byte goes out; an error aborts the connection
	err      error        // first write error (a client gone or too slow)
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
	if n, err := strconv.ParseInt(c.Header().Get("Content-Length"), 10, 64); err == nil {
		c.want = n
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
	n, err := c.send(b)
	c.noteErr(err)
	return n, err
}

// send writes b and counts it. The body's last byte waits for final: every
// read of the file is done by then (a multipart body ends with its closing
// boundary, written after the last part), so final sees the file as it
// was read.
func (c *contentWriter) send(b []byte) (int, error) {
	if last := c.want - 1 - c.n; c.final != nil && last >= 0 && last < int64(len(b)) {
		n, err := c.ResponseWriter.Write(b[:last])
		c.n += int64(n)
		if err != nil {
			return n, err
		}
		if c.final() != nil {
			panic(http.ErrAbortHandler) // final said why
		}
		c.final = nil
		m, err := c.ResponseWriter.Write(b[last:])
		c.n += int64(m)
		return n + m, err
	}
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
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
		n, err := copyBody(writerFunc(c.send), chunk)
		total += n
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
// ceiling"). A buffer is held while its body is sent, however slowly the
// client reads: so only bigSendBuffers bodies at once get 1 MiB (more than
// the cores can copy at once gain nothing from it), the others 64 KiB, and
// hundreds of clients that stop reading hold 64 KiB each, not 1 MiB
// (issue 26).
var (
	bigSends         = make(chan struct{}, max(8, 2*runtime.GOMAXPROCS(0)))
	bigSendBuffers   = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}
	smallSendBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}
)

func getSendBuffer() *[]byte {
	select {
	case bigSends <- struct{}{}:
		return bigSendBuffers.Get().(*[]byte)
	default:
		return smallSendBuffers.Get().(*[]byte)
	}
}

func putSendBuffer(bp *[]byte) {
	if len(*bp) == 1<<20 {
		bigSendBuffers.Put(bp)
		<-bigSends
		return
	}
	smallSendBuffers.Put(bp)
}

// copyBody copies src to w through a sendBuffer (hiding w's ReadFrom and
// src's WriteTo, which would sendfile).
func copyBody(w io.Writer, src io.Reader) (int64, error) {
	bp := getSendBuffer()
	defer putSendBuffer(bp)
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{src}, *bp)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

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
