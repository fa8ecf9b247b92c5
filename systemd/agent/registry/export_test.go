package registry

import "time"

// WithRequestLog turns the one-line-per-request log on or off (default on).
func WithRequestLog(on bool) Option { return func(s *Server) { s.logRequests = on } }

// WithWriteTimeout sets how long a client may take to accept each chunk
// (4 MiB) of a response before its connection is closed (default 30s): a
// reader that stops reading does not hold a connection and an open blob
// for ever.
func WithWriteTimeout(d time.Duration) Option { return func(s *Server) { s.writeTimeout = d } }
