package registry

import (
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// maxConns bounds the connections the registry holds open at once (issue
// 26: 500 clients that asked for a blob and read nothing held 570 MB). Its
// clients are the node's runtime and podman on loopback; a pull opens a
// few connections (containers/image fetches up to 6 layers at once), so 256
// are dozens of pulls at once. Past it a new connection waits in the
// listen backlog until one closes, and an idle keep-alive connection is
// closed to make room (its client opens another when it needs one).
// TestServeLoad holds the unit's MemoryMax and TasksMax against it.
const maxConns = 256

// connLimiter is a listener that accepts at most n connections at once.
// The server reports each connection's state to it (connState), so it
// knows which are idle between requests.
type connLimiter struct {
	net.Listener
	slots     chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	mu      sync.Mutex
	idle    map[net.Conn]bool
	waiting int // Accepts waiting for a slot
}

func limitConns(l net.Listener, n int) *connLimiter {
	return &connLimiter{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{}), idle: map[net.Conn]bool{}}
}

func (l *connLimiter) Accept() (net.Conn, error) {
	if !l.take() {
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

// take waits for a free slot, closing an idle connection to make one; it
// returns false once the listener is closed.
func (l *connLimiter) take() bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	l.mu.Lock()
	l.waiting++
	l.closeOneIdle()
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.waiting--
		l.mu.Unlock()
	}()
	select {
	case l.slots <- struct{}{}:
		return true
	case <-l.done:
		return false
	}
}

func (l *connLimiter) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// connState is the http.Server's ConnState hook: a connection idle
// between requests is closed at once while an Accept waits for a slot, and
// remembered otherwise.
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.idle, c)
	if st != http.StateIdle {
		return
	}
	if l.waiting > 0 {
		c.Close()
		return
	}
	l.idle[c] = true
}

// closeOneIdle closes an idle connection, if there is one; l.mu is held.
func (l *connLimiter) closeOneIdle() {
	for c := range l.idle {
		delete(l.idle, c)
		c.Close()
		return
	}
}

// limitedConn gives its slot back when it is closed (once, however often
// it is closed).
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// memoryReturn gives the memory a burst of requests used back to the
// system once no request has run for a second: the Go runtime keeps freed
// heap for reuse and returns it only slowly, so a registry that served
// hundreds of clients once would hold their memory for minutes. It does so
// only after the requests allocated more than returnAfter since the last
// time: a collection is not free, and a few manifest requests need none.
type memoryReturn struct {
	inFlight  atomic.Int64
	scheduled atomic.Bool
	allocs    uint64 // heap allocated, as of the last look
}

const returnAfter = 8 << 20

func (m *memoryReturn) begin() { m.inFlight.Add(1) }

func (m *memoryReturn) end() {
	if m.inFlight.Add(-1) != 0 || !m.scheduled.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(time.Second, func() {
		defer m.scheduled.Store(false)
		if m.inFlight.Load() != 0 {
			return
		}
		s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
		metrics.Read(s)
		if allocs := s[0].Value.Uint64(); allocs-m.allocs > returnAfter {
			m.allocs = allocs
			runtime.GC() // pooled buffers outlive one collection
			debug.FreeOSMemory()
		}
	})
}
