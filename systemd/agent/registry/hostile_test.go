package registry

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNotRegularBlobs (audit row 4): a blob file that is a symlink (even to
// a same-size file elsewhere), a FIFO or a directory is never opened as the
// blob: 404 BLOB_UNKNOWN, logged at start and on each request.
func TestNotRegularBlobs(t *testing.T) {
	secret := []byte(strings.Repeat("secret!", 1<<10))
	for _, tc := range []struct {
		name    string
		replace func(t *testing.T, path string, size int64)
	}{
		{"symlink to a same-size file elsewhere", func(t *testing.T, path string, size int64) {
			outside := filepath.Join(t.TempDir(), "outside")
			if err := os.WriteFile(outside, bytes.Repeat(secret, int(size)/len(secret)+1)[:size], 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"FIFO", func(t *testing.T, path string, _ int64) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory", func(t *testing.T, path string, _ int64) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			layer := must(f.app.Manifest()).Layers[0]
			tc.replace(t, f.blobPath(layer.Digest), layer.Size)
			log, logs := testLogger()
			s := must(New([]string{f.dir}, WithLogger(log)))
			if got := s.Stats().Damaged; got != 1 {
				t.Errorf("Stats().Damaged = %d, want 1", got)
			}
			if !strings.Contains(logs.String(), "not a regular file") {
				t.Errorf("start log does not report the file:\n%s", logs)
			}
			url := "http://" + serve(t, s) + "/v2/quay.io/acme/app/blobs/" + layer.Digest.String()
			for _, hdr := range []map[string]string{nil, {"Range": "bytes=0-9"}} {
				for _, method := range []string{"GET", "HEAD"} {
					resp, body := get(t, method, url, hdr)
					if resp.StatusCode != http.StatusNotFound {
						t.Errorf("%s %v: status %d, want 404", method, hdr, resp.StatusCode)
					}
					if method == "GET" && apiErrorCode(body) != codeBlobUnknown {
						t.Errorf("%s %v: body %s, want BLOB_UNKNOWN", method, hdr, body)
					}
					if bytes.Contains(body, secret[:16]) {
						t.Errorf("%s %v: served the symlink's target", method, hdr)
					}
				}
			}
			if n := strings.Count(logs.String(), "blob file is not a regular file: not served"); n != 4 {
				t.Errorf("%d request log lines about the file, want 4:\n%s", n, logs)
			}
		})
	}
}

// TestLayoutSymlinks: a manifest or the blobs directory that is a symlink
// fails the start, naming the file.
func TestLayoutSymlinks(t *testing.T) {
	for _, tc := range []struct {
		name string
		path func(f *fixture) string
		want string
	}{
		{"manifest", func(f *fixture) string { return f.blobPath(f.appDigest) }, "not a regular file"},
		{"blobs/sha256", func(f *fixture) string { return filepath.Join(f.dir, "blobs", "sha256") }, "blobs/sha256 is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			p := tc.path(f)
			moved := filepath.Join(t.TempDir(), "moved")
			if err := os.Rename(p, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(moved, p); err != nil {
				t.Fatal(err)
			}
			log, _ := testLogger()
			_, err := New([]string{f.dir}, WithLogger(log))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New with %s a symlink: %v, want an error saying %q", tc.name, err, tc.want)
			}
		})
	}
}

// TestWriteTimeout (audit row 5): a client that asks for a 64 MiB blob and
// never reads is cut off after the write timeout; one that reads gets the
// whole blob with the same timeout.
func TestWriteTimeout(t *testing.T) {
	const size = 64 << 20
	dir, layer := bigImage(t, size)
	log, logs := testLogger()
	// 2 s, not less: the timeout bounds each write, so a reader that reads
	// must never be cut off, and on a loaded machine (QEMU guests beside
	// the tests) this process's reading goroutine was starved for 300 ms
	// and got 1 MiB. The client that never reads is still cut off at once.
	addr := serve(t, must(New([]string{dir}, WithLogger(log), WithWriteTimeout(2*time.Second))))
	path := "/v2/quay.io/acme/big/blobs/" + layer.String()

	// A reader that reads: the whole blob.
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != size {
		t.Fatalf("reading client got %d bytes (%v), want %d", n, err, size)
	}

	// A reader that never reads.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr)
	deadline := time.Now().Add(30 * time.Second)
	server := serverSocket(t, c)
	for server == "socket:[0]" && time.Now().Before(deadline) { // not accepted yet
		time.Sleep(10 * time.Millisecond)
		server = serverSocket(t, c)
	}
	for !strings.Contains(logs.String(), "client took no data for the write timeout") {
		if time.Now().After(deadline) {
			t.Fatalf("the server still holds a client that never reads:\n%s", logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The server let go of the blob file and of its end of the connection
	// (what the kernel still has to send of it is no longer this process's).
	blob := filepath.Join(dir, "blobs", "sha256", layer.Hex)
	for {
		fds := openFDs(t)
		if !fds[blob] && !fds[server] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the blob file (%v) or the connection's socket (%v) is still open", fds[blob], fds[server])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openFDs returns the targets of this process's open file descriptors
// (paths, or "socket:[inode]").
func openFDs(t *testing.T) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	open := map[string]bool{}
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			open[target] = true
		}
	}
	return open
}

// serverSocket returns "socket:[inode]" of the server's end of client
// connection c, from /proc/net/tcp (addresses in hex, little-endian IPv4).
func serverSocket(t *testing.T, c net.Conn) string {
	t.Helper()
	hexAddr := func(a net.Addr) string {
		ta := a.(*net.TCPAddr)
		ip := ta.IP.To4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ta.Port)
	}
	local, remote := hexAddr(c.RemoteAddr()), hexAddr(c.LocalAddr())
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == local && f[2] == remote {
			return "socket:[" + f[9] + "]"
		}
	}
	t.Fatalf("no server socket %s → %s in /proc/net/tcp", local, remote)
	return ""
}

// TestContentTypeIsTheManifests: when index.json's descriptor names another
// media type than the manifest's own mediaType field, the manifest's wins
// (the spec: clients reject a Content-Type that differs from that field).
func TestContentTypeIsTheManifests(t *testing.T) {
	dir, _ := bigImage(t, 100)
	idx := filepath.Join(dir, "index.json")
	b, err := os.ReadFile(idx)
	if err != nil {
		t.Fatal(err)
	}
	const oci, docker = "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"
	if !bytes.Contains(b, []byte(oci)) {
		t.Fatalf("fixture index.json has no %s: %s", oci, b)
	}
	if err := os.WriteFile(idx, bytes.ReplaceAll(b, []byte(oci), []byte(docker)), 0o644); err != nil {
		t.Fatal(err)
	}
	log, _ := testLogger()
	resp, body := get(t, "GET", "http://"+serve(t, must(New([]string{dir}, WithLogger(log))))+"/v2/quay.io/acme/big/manifests/1", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != oci || !bytes.Contains(body, []byte(`"mediaType":"`+oci)) {
		t.Errorf("status %d, Content-Type %q, want %s (the manifest's own mediaType); body %s", resp.StatusCode, resp.Header.Get("Content-Type"), oci, body)
	}
}
