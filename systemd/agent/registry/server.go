// Package registry is kiln's read-only OCI distribution server: the
// temporary local registry a node serves from its image partition
// (`kiln serve`). It serves the pull side of the distribution spec v1.1 over
// one or more OCI image layouts, indexed once at start; every write is
// refused.
package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sync/singleflight"
)

// shutdownTimeout is how long Serve lets in-flight requests finish after
// its context is cancelled.
const shutdownTimeout = 5 * time.Second

// Server serves OCI layouts read-only. It is an http.Handler.
type Server struct {
	ix           *index
	log          *slog.Logger
	logRequests  bool
	writeTimeout time.Duration
	ready        func(Stats)
	checks       sync.Map // blob digest → its last check (check.go)
	hashing      singleflight.Group
	trust        trustOf
	memory       memoryReturn
	maxConns     int // connections held at once (maxConns; fewer in tests)
	layouts      int // the layouts served
	onVerity     int // of which on dm-verity
	releases     *releaseSource
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithReady sets a function Serve calls once the listener is accepting
// (the index is loaded by then): the place for sd_notify READY=1.
func WithReady(f func(Stats)) Option { return func(s *Server) { s.ready = f } }

// WithReleaseState also serves the releases the node's release state keeps
// and runs or may roll back to (the one being tried, the current one, the
// previous one), read from stateFile at start, their blobs from the release
// store at store (blobs/sha256/<hex>) and from the layouts. Their names win
// over the layouts' for the same tag. A missing state file serves the
// layouts only.
func WithReleaseState(stateFile, store string) Option {
	return func(s *Server) { s.releases = &releaseSource{stateFile: stateFile, store: store} }
}

// New indexes the OCI layouts in dirs (each an OCI layout, or an image
// partition root holding kiln.json and oci/) and returns a server for them.
// A layout with the factory's prebuilt index (regindex.FileName)
// is known from that file alone, its manifests read and verified on first
// request; any other layout's manifests are read and verified now and its
// blobs stat'ed.
func New(dirs []string, opts ...Option) (*Server, error) {
	s := &Server{log: slog.Default(), logRequests: true, writeTimeout: 30 * time.Second,
		trust: trustOf{sysfs: "/sys"}, maxConns: maxConns}
	for _, o := range opts {
		o(s)
	}
	ix, err := loadIndex(dirs, s.releases, s.log)
	if err != nil {
		return nil, err
	}
	s.ix = ix
	for _, d := range dirs {
		s.noteTrust(d)
	}
	return s, nil
}

// noteTrust says how far the blobs of the layout in dir are trusted
// between reads (check.go), and counts the layouts on dm-verity.
func (s *Server) noteTrust(dir string) {
	root, err := layoutRoot(dir)
	if err != nil {
		return // loadIndex took it, so it cannot fail now
	}
	f, err := os.Open(root)
	if err != nil {
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return
	}
	s.layouts++
	if s.trust.of(f, stampOf(fi).dev) == verity {
		s.onVerity++
		s.log.Info("layout on dm-verity: its blobs are the bytes the build wrote, hashed on their first full read only", "layout", root)
		return
	}
	s.log.Info("layout not on dm-verity: every blob is checked against its digest before its bytes go out, and again whenever its file changes", "layout", root)
}

// Stats reports what the server serves.
func (s *Server) Stats() Stats {
	st := s.ix.stats()
	st.Layouts, st.Verity = s.layouts, s.onVerity
	return st
}

// Serve serves HTTP on l until ctx is cancelled, then stops accepting and
// lets in-flight requests finish for the shutdown timeout. It returns nil
// after a clean stop.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	cl := limitConns(l, s.maxConns)
	l = cl
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnState:         cl.connState,
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	if s.ready != nil {
		s.ready(s.Stats())
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("requests still running at shutdown; closing them", "timeout", shutdownTimeout)
		err = hs.Close()
	}
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) {
		return e
	}
	return err
}

// Run is `kiln serve`: it indexes dirs, listens on addr, tells systemd
// READY=1 (with a STATUS= line of counts) once the index is loaded and the
// listener accepts, and serves until ctx is cancelled (SIGTERM), then tells
// systemd STOPPING=1 and drains in-flight requests.
func Run(ctx context.Context, addr string, dirs []string, opts ...Option) error {
	var log *slog.Logger
	opts = append(opts, func(s *Server) { log = s.log })
	ready := func(st Stats) {
		status := fmt.Sprintf("serving %d repositories, %d tags, %d blobs on %s", st.Repositories, st.Tags, st.Blobs, addr)
		if st.Prebuilt > 0 {
			status += "; index prebuilt by the factory, manifests and blobs checked when first served"
		}
		status += fmt.Sprintf("; %d of %d layouts on dm-verity", st.Verity, st.Layouts)
		if st.Damaged > 0 {
			status += fmt.Sprintf("; %d blobs DAMAGED or missing, see the journal", st.Damaged)
		}
		log.Info("ready", "status", status)
		if _, err := daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS="+status); err != nil {
			log.Warn("sd_notify failed", "error", err)
		}
	}
	// New allocates the whole index at once from a heap of almost nothing
	// (6 MB at 2,000 images): at the default GOGC the collector ran twice
	// before READY, on one of two cores. Run owns the process, so it
	// collects less often while loading and restores the default for
	// serving (docs/decisions.md).
	gc := debug.SetGCPercent(400)
	s, err := New(dirs, append(opts, WithReady(ready))...)
	debug.SetGCPercent(gc)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s (is another registry running there? change --listen): %w", addr, err)
	}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done(): // tell systemd as soon as the drain starts
			daemon.SdNotify(false, daemon.SdNotifyStopping)
		case <-stopped:
		}
	}()
	return s.Serve(ctx, l)
}

// ServeHTTP routes one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.memory.begin()
	defer s.memory.end()
	if !s.logRequests {
		s.serve(w, r)
		return
	}
	start := time.Now()
	cw := &countingWriter{ResponseWriter: w, status: http.StatusOK}
	defer func() {
		attrs := []any{"method", r.Method, "path", r.URL.EscapedPath(), "status", cw.status,
			"bytes", cw.n, "ms", time.Since(start).Milliseconds(), "client", r.RemoteAddr}
		if p := recover(); p != nil {
			s.log.Warn("request aborted", attrs...)
			panic(p) // net/http closes the connection
		}
		s.log.Info("request", attrs...)
	}()
	s.serve(cw, r)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	// Every answer but a body's chunks (serveContent) must go out within the
	// write timeout; not supported (ignored) on a test recorder.
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.writeTimeout))
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	rt, aerr := parseRoute(r.URL.EscapedPath())
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		// A malformed name or reference is reported as such (400, as the
		// conformance suite expects of a PUT to "sha256:totallywrong");
		// everything else is refused.
		if aerr != nil && aerr.Status == http.StatusBadRequest {
			w.Header().Set("Connection", "close")
			aerr.write(w)
			return
		}
		s.refuse(w, r)
		return
	}
	if aerr != nil {
		aerr.write(w)
		return
	}
	switch rt.kind {
	case routeBase:
		writeJSON(w, "application/json", []byte("{}"))
	case routeCatalog:
		s.catalog(w, r)
	case routeUpload:
		s.refuse(w, r)
	default:
		repo := s.ix.repos[rt.name]
		if repo == nil {
			newError(http.StatusNotFound, codeNameUnknown, "repository "+rt.name+" is not on this node").write(w)
			return
		}
		switch rt.kind {
		case routeManifest:
			s.manifest(w, r, repo, rt)
		case routeBlob:
			s.blob(w, r, repo, rt)
		case routeTags:
			s.tags(w, r, repo, rt)
		case routeReferrers:
			s.referrers(w, r, repo, rt)
		}
	}
}

// refuse answers every write (and any other method) with 405 UNSUPPORTED.
// The request body is never read (so no "100 Continue" invites a client to
// send it) and the connection is closed instead of drained.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Allow", "GET, HEAD")
	h.Set("Connection", "close")
	newError(http.StatusMethodNotAllowed, codeUnsupported, "this registry is read-only (kiln image partition): "+r.Method+" is not supported").write(w)
}

// countingWriter records the status and body bytes of a response. It keeps
// io.ReaderFrom, so a body copied to it is not copied once more.
type countingWriter struct {
	http.ResponseWriter
	status      int
	n           int64
	wroteHeader bool
}

func (c *countingWriter) WriteHeader(status int) {
	if !c.wroteHeader {
		c.status, c.wroteHeader = status, true
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	c.wroteHeader = true
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

func (c *countingWriter) ReadFrom(src io.Reader) (int64, error) {
	c.wroteHeader = true
	n, err := readFrom(c.ResponseWriter, src)
	c.n += n
	return n, err
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
