package registry

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// helperEnv makes the test binary run Run (what `kiln serve` runs) instead
// of the tests: a real process the tests can SIGKILL and SIGTERM.
const helperEnv = "KILN_REGISTRY_TEST_SERVE"

func TestMain(m *testing.M) {
	if args := os.Getenv(helperEnv); args != "" {
		addr, dir, _ := strings.Cut(args, " ")
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		if err := Run(ctx, addr, []string{dir}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// bigImage writes an OCI layout holding quay.io/acme/big:1 whose one layer
// is size random bytes, and returns the layout dir and the layer digest.
func bigImage(t testing.TB, size int) (string, v1.Hash) {
	t.Helper()
	data := make([]byte, size)
	rand.New(rand.NewSource(1)).Read(data)
	l := static.NewLayer(data, types.OCILayer)
	img := must(mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), l))
	dir := filepath.Join(t.TempDir(), "oci")
	p := must(layout.Write(dir, empty.Index))
	if err := p.AppendImage(img, refName("quay.io/acme/big:1")); err != nil {
		t.Fatal(err)
	}
	return dir, must(l.Digest())
}

// TestDamagedBlobs: damaged blob files are answered 500 at request with
// either start; the start that indexes the layout also counts and logs
// them, the prebuilt index's start looks at no blob.
func TestDamagedBlobs(t *testing.T) {
	for _, mode := range indexModes {
		t.Run(mode.name, func(t *testing.T) { testDamagedBlobs(t, mode) })
	}
}

func testDamagedBlobs(t *testing.T, mode indexMode) {
	f := newFixture(t)
	mode.prepare(t, f.dir)
	mf := must(f.app.Manifest())
	missing, short, long := mf.Layers[0].Digest, mf.Layers[1].Digest, mf.Config.Digest
	if err := os.Remove(f.blobPath(missing)); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f.blobPath(short), mf.Layers[1].Size/2); err != nil {
		t.Fatal(err)
	}
	af := must(os.OpenFile(f.blobPath(long), os.O_APPEND|os.O_WRONLY, 0))
	af.Write([]byte("junk"))
	af.Close()

	log, logs := testLogger()
	s := must(New([]string{f.dir}, WithLogger(log)))
	if want := 3 * (1 - mode.prebuilt); s.Stats().Damaged != want {
		t.Errorf("Stats().Damaged = %d, want %d", s.Stats().Damaged, want)
	}
	for _, d := range []v1.Hash{missing, short, long} {
		if mode.prebuilt == 0 && !strings.Contains(logs.String(), f.blobPath(d)) {
			t.Errorf("start log does not name damaged file %s:\n%s", f.blobPath(d), logs)
		}
	}
	base := "http://" + serve(t, s) + "/v2/quay.io/acme/app/blobs/"
	for _, d := range []v1.Hash{missing, short, long} {
		for _, tc := range []struct {
			method string
			hdr    map[string]string
		}{{"GET", nil}, {"HEAD", nil}, {"GET", map[string]string{"Range": "bytes=0-3"}}} {
			resp, body := get(t, tc.method, base+d.String(), tc.hdr)
			if resp.StatusCode != http.StatusInternalServerError {
				t.Errorf("%s %s %v: status %d, want 500", tc.method, d, tc.hdr, resp.StatusCode)
			}
			if tc.method == "GET" && (apiErrorCode(body) != codeUnknown || !strings.Contains(string(body), "kiln verify")) {
				t.Errorf("%s %s: body %s, want an UNKNOWN error telling to run kiln verify", tc.method, d, body)
			}
		}
	}
	if n := strings.Count(logs.String(), "blob file damaged"); n < 9 {
		t.Errorf("%d request-time damage log lines, want 9:\n%s", n, logs)
	}
	// The undamaged manifest is still served.
	if resp, _ := get(t, "GET", strings.TrimSuffix(base, "blobs/")+"manifests/1.2", nil); resp.StatusCode != 200 {
		t.Errorf("manifest of a damaged image: status %d, want 200", resp.StatusCode)
	}
}

// TestCorruptBlob: a blob of the right size but wrong content is caught on
// its first full read: the client never gets it complete (the connection
// breaks before the last bytes), and later requests, Range ones too, get a
// 500. A Range read first hashes the whole blob and gets the 500 itself.
func TestCorruptBlob(t *testing.T) {
	for _, size := range []int{100, 8 << 20} { // one read; many reads
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			dir, layer := bigImage(t, size)
			path := filepath.Join(dir, "blobs", "sha256", layer.Hex)
			f := must(os.OpenFile(path, os.O_WRONLY, 0))
			f.WriteAt([]byte{'!'}, int64(size-3))
			f.Close()
			log, logs := testLogger()
			base := "http://" + serve(t, must(New([]string{dir}, WithLogger(log)))) + "/v2/quay.io/acme/big/blobs/" + layer.String()
			// (Go's client may retry the aborted GET and then get the 500.)
			resp, err := http.Get(base)
			if err == nil {
				n, rerr := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if rerr == nil && resp.StatusCode == 200 {
					t.Fatalf("corrupt blob served completely: status %d, %d bytes", resp.StatusCode, n)
				}
			}
			if !strings.Contains(logs.String(), "does not match its digest") || !strings.Contains(logs.String(), path) {
				t.Errorf("corruption not logged with the file name:\n%s", logs)
			}
			for _, hdr := range []map[string]string{nil, {"Range": "bytes=0-9"}} {
				if resp, body := get(t, "GET", base, hdr); resp.StatusCode != 500 || !strings.Contains(string(body), "kiln verify") {
					t.Errorf("after detection, %v: %d %s, want 500", hdr, resp.StatusCode, body)
				}
			}
			// A fresh server: the Range comes first.
			base = "http://" + serve(t, must(New([]string{dir}, WithLogger(log)))) + "/v2/quay.io/acme/big/blobs/" + layer.String()
			if resp, body := get(t, "GET", base, map[string]string{"Range": "bytes=0-9"}); resp.StatusCode != 500 || !strings.Contains(string(body), "kiln verify") {
				t.Errorf("Range before any full read: %d %s, want 500", resp.StatusCode, body)
			}
		})
	}
}

// TestTruncatedMidStream: a blob file that shrinks while it is being sent
// must break the connection, never end as a short body with a clean EOF.
func TestTruncatedMidStream(t *testing.T) {
	dir, layer := bigImage(t, 32<<20)
	log, logs := testLogger()
	addr := serve(t, must(New([]string{dir}, WithLogger(log))))
	resp, err := http.Get("http://" + addr + "/v2/quay.io/acme/big/blobs/" + layer.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.CopyN(io.Discard, resp.Body, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "blobs", "sha256", layer.Hex), 8<<20); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil {
		t.Fatalf("body ended cleanly after %d more bytes of a truncated blob", n)
	}
	if !strings.Contains(logs.String(), "blob ended early") || !strings.Contains(logs.String(), "request aborted") {
		t.Errorf("no log line about the truncated blob:\n%s", logs)
	}
}

// countingReader is an endless request body that counts what was read.
type countingReader struct{ n atomic.Int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}

func TestWritesWithBodies(t *testing.T) {
	f := newFixture(t)
	log, _ := testLogger()
	s := must(New([]string{f.dir}, WithLogger(log)))

	// In the handler: no byte of a body is read.
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		body := &countingReader{}
		req := httptest.NewRequest(m, "/v2/quay.io/acme/app/blobs/uploads/x", io.NopCloser(body))
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 405 || apiErrorCode(rec.Body.Bytes()) != codeUnsupported {
			t.Errorf("%s: %d %s, want 405 UNSUPPORTED", m, rec.Code, rec.Body)
		}
		if body.n.Load() != 0 {
			t.Errorf("%s: handler read %d body bytes", m, body.n.Load())
		}
	}

	// Over the wire: a 4 GiB upload is answered at once, and the server
	// takes in only what the socket buffers hold.
	addr := serve(t, s)
	body := &countingReader{}
	req := must(http.NewRequest("PUT", "http://"+addr+"/v2/quay.io/acme/app/blobs/uploads/x?digest=sha256:00", io.NopCloser(io.LimitReader(body, 4<<30))))
	req.ContentLength = 4 << 30
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT with a large body: %v (want a 405 response)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("PUT: status %d, want 405", resp.StatusCode)
	}
	el, n := time.Since(start), body.n.Load()
	t.Logf("PUT of 4 GiB: 405 after %v, %d KiB of the body sent", el.Round(time.Millisecond), n>>10)
	if el > 5*time.Second || n > 256<<20 {
		t.Errorf("PUT of 4 GiB: %d bytes sent in %v before the 405; the body is being read", n, el)
	}
}

// TestWriteExpectContinue: a client that asks before sending its body
// (Expect: 100-continue) is refused without sending any of it.
func TestWriteExpectContinue(t *testing.T) {
	f := newFixture(t)
	log, _ := testLogger()
	addr := serve(t, must(New([]string{f.dir}, WithLogger(log))))
	body := &countingReader{}
	req := must(http.NewRequest("PUT", "http://"+addr+"/v2/quay.io/acme/app/manifests/1.2", io.NopCloser(io.LimitReader(body, 1<<30))))
	req.ContentLength = 1 << 30
	req.Header.Set("Expect", "100-continue")
	c := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 5 * time.Second}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || body.n.Load() != 0 {
		t.Errorf("status %d, %d body bytes sent; want 405 and none", resp.StatusCode, body.n.Load())
	}
}

// pullAll fetches a manifest by tag and every blob it references, checking
// each against its digest. It returns the bytes read.
func pullAll(c *http.Client, base, repo, tag string) (int64, error) {
	resp, err := c.Get(base + "/v2/" + repo + "/manifests/" + tag)
	if err != nil {
		return 0, err
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		return 0, fmt.Errorf("manifest %s:%s: %d %v", repo, tag, resp.StatusCode, err)
	}
	if d := resp.Header.Get("Docker-Content-Digest"); sha(raw) != d {
		return 0, fmt.Errorf("manifest %s:%s: digest %s, header %s", repo, tag, sha(raw), d)
	}
	m := must(v1.ParseManifest(strings.NewReader(string(raw))))
	total := int64(len(raw))
	for _, d := range append([]v1.Descriptor{m.Config}, m.Layers...) {
		resp, err := c.Get(base + "/v2/" + repo + "/blobs/" + d.Digest.String())
		if err != nil {
			return total, err
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n != d.Size || "sha256:"+hex.EncodeToString(h.Sum(nil)) != d.Digest.String() {
			return total, fmt.Errorf("blob %s: status %d, %d bytes, err %v", d.Digest, resp.StatusCode, n, err)
		}
		total += n
	}
	return total, nil
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// TestManyClients: 32 concurrent clients × 8 full pulls each, every byte
// checked; nothing may fail.
func TestManyClients(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oci")
	p := must(layout.Write(dir, empty.Index))
	const images = 4
	for i := 0; i < images; i++ {
		if err := p.AppendImage(ociImage(t, "amd64", 2, 1<<20), refName(fmt.Sprintf("quay.io/acme/load%d:v1", i))); err != nil {
			t.Fatal(err)
		}
	}
	log, _ := testLogger()
	base := "http://" + serve(t, must(New([]string{dir}, WithLogger(log), WithRequestLog(false))))
	const clients, pulls = 32, 8
	var wg sync.WaitGroup
	var bytes atomic.Int64
	errs := make(chan error, clients*pulls)
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := &http.Client{Transport: &http.Transport{}} // own connections per client
			defer cl.CloseIdleConnections()
			for i := 0; i < pulls; i++ {
				n, err := pullAll(cl, base, fmt.Sprintf("quay.io/acme/load%d", (c+i)%images), "v1")
				bytes.Add(n)
				if err != nil {
					errs <- err
				}
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	el := time.Since(start)
	t.Logf("%d clients × %d pulls: %d MiB in %v (%.0f MiB/s)", clients, pulls, bytes.Load()>>20, el.Round(time.Millisecond), float64(bytes.Load())/(1<<20)/el.Seconds())
}

func TestMerge(t *testing.T) {
	a, b := newFixture(t), newFixture(t) // same names, different random content
	log, logs := testLogger()
	s := must(New([]string{a.dir, b.dir}, WithLogger(log)))
	base := "http://" + serve(t, s)
	resp, _ := get(t, "GET", base+"/v2/quay.io/acme/app/manifests/1.2", nil)
	if d := resp.Header.Get("Docker-Content-Digest"); d != a.appDigest.String() {
		t.Errorf("app:1.2 served as %s, want the first layout's %s", d, a.appDigest)
	}
	if !strings.Contains(logs.String(), "the first source wins it") || !strings.Contains(logs.String(), "quay.io/acme/app:1.2") {
		t.Errorf("conflict not logged:\n%s", logs)
	}
	// The second layout's app:1.2 lost its tag but is still served by digest.
	if resp, _ := get(t, "GET", base+"/v2/quay.io/acme/app/manifests/"+b.appDigest.String(), nil); resp.StatusCode != 200 {
		t.Errorf("second layout's app by digest: status %d", resp.StatusCode)
	}
	// The second layout's digest-only image is still reachable by digest.
	if resp, _ := get(t, "GET", base+"/v2/quay.io/acme/pinned/manifests/"+b.pinnedDigest.String(), nil); resp.StatusCode != 200 {
		t.Errorf("second layout's pinned image: status %d", resp.StatusCode)
	}
	// Same content in both layouts: indexed once.
	twice, once := must(New([]string{a.dir, a.dir}, WithLogger(log))).Stats(), must(New([]string{a.dir}, WithLogger(log))).Stats()
	if once.Layouts++; twice != once {
		t.Errorf("same layout twice: %+v, want %+v", twice, once)
	}
	if !strings.Contains(logs.String(), `entry="`+a.dir+`/index.json manifests[4]"`) {
		t.Errorf("bare-tag entry not warned about:\n%s", logs)
	}
}

func TestLoadErrors(t *testing.T) {
	log, _ := testLogger()
	for _, tc := range []struct {
		name  string
		setup func(f *fixture) string // returns the dir to serve
		err   string
	}{
		{"not a layout", func(f *fixture) string { return filepath.Dir(f.dir) }, "no oci-layout file"},
		{"bad oci-layout", func(f *fixture) string {
			os.WriteFile(filepath.Join(f.dir, "oci-layout"), []byte(`{"imageLayoutVersion":"9"}`), 0o644)
			return f.dir
		}, "want imageLayoutVersion 1.0.0"},
		{"bad index.json", func(f *fixture) string {
			os.WriteFile(filepath.Join(f.dir, "index.json"), []byte(`{"manifests":[`), 0o644)
			return f.dir
		}, "index.json"},
		// Valid JSON, one byte over: the limit is named, not "unexpected EOF".
		{"index.json over the limit", func(f *fixture) string {
			p := filepath.Join(f.dir, "index.json")
			b := must(os.ReadFile(p))
			pad := bytes.Repeat([]byte(" "), maxManifestSize+1-len(b))
			os.WriteFile(p, append(pad, b...), 0o644)
			return f.dir
		}, "index.json is 4194305 bytes, over the limit of 4194304 (4.0 MiB)"},
		{"missing manifest", func(f *fixture) string {
			os.Remove(f.blobPath(f.appDigest))
			return f.dir
		}, "manifests[0]: manifest APPDIGEST"},
		{"corrupt manifest", func(f *fixture) string {
			b := must(os.ReadFile(f.blobPath(f.appDigest)))
			b[len(b)-2] ^= 1
			os.WriteFile(f.blobPath(f.appDigest), b, 0o644)
			return f.dir
		}, "does not match its digest"},
		// Read with a buffer sized from the descriptor: a byte more or less shows.
		{"manifest one byte longer", func(f *fixture) string {
			appendTo(f.blobPath(f.appDigest), " ")
			return f.dir
		}, "does not match its digest"},
		{"manifest one byte shorter", func(f *fixture) string {
			p := f.blobPath(f.appDigest)
			fi := must(os.Stat(p))
			os.Truncate(p, fi.Size()-1)
			return f.dir
		}, "does not match its digest"},
		{"manifest is a FIFO", func(f *fixture) string {
			os.Remove(f.blobPath(f.appDigest))
			syscall.Mkfifo(f.blobPath(f.appDigest), 0o644)
			return f.dir
		}, "is a FIFO (named pipe), not a regular file"},
		{"manifest is a directory", func(f *fixture) string {
			os.Remove(f.blobPath(f.appDigest))
			os.Mkdir(f.blobPath(f.appDigest), 0o755)
			return f.dir
		}, "is a directory, not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			_, err := New([]string{tc.setup(f)}, WithLogger(log))
			want := strings.ReplaceAll(tc.err, "APPDIGEST", f.appDigest.String()) // known once built
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("New: %v, want an error containing %q", err, want)
			}
		})
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil): no error")
	}
}

func appendTo(path, s string) {
	f := must(os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0))
	f.WriteString(s)
	f.Close()
}

func TestMissingIndexChild(t *testing.T) {
	f := newFixture(t)
	arm := must(f.multi.IndexManifest()).Manifests[1].Digest
	os.Remove(f.blobPath(arm))
	log, logs := testLogger()
	base := "http://" + serve(t, must(New([]string{f.dir}, WithLogger(log))))
	if resp, _ := get(t, "GET", base+"/v2/quay.io/acme/multi/manifests/1.0", nil); resp.StatusCode != 200 {
		t.Errorf("index with a missing child: status %d, want 200", resp.StatusCode)
	}
	if resp, _ := get(t, "GET", base+"/v2/quay.io/acme/multi/manifests/"+arm.String(), nil); resp.StatusCode != 404 {
		t.Errorf("missing child: status %d, want 404", resp.StatusCode)
	}
	if !strings.Contains(logs.String(), "that platform is not served") {
		t.Errorf("missing child not logged:\n%s", logs)
	}
}

func TestImagePartitionRoot(t *testing.T) {
	f := newFixture(t)
	root := t.TempDir()
	if err := os.Rename(f.dir, filepath.Join(root, contract.OCIDir)); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, contract.ContentsFile), []byte(`{"schemaVersion":1}`), 0o644)
	log, _ := testLogger()
	s, err := New([]string{root}, WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Repositories != 4 {
		t.Errorf("image partition root: %+v, want 4 repositories", st)
	}
}

// helper starts this test binary as a `kiln serve` process on addr, with
// NOTIFY_SOCKET set, and waits for READY=1. It returns the process and the
// notification text.
func helper(t *testing.T, addr, dir string) (*exec.Cmd, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "notify")
	nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+addr+" "+dir, "NOTIFY_SOCKET="+sock)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 4096)
	n, err := nc.Read(buf)
	if err != nil {
		t.Fatalf("no sd_notify from kiln serve: %v\n%s", err, stderr.String())
	}
	msg := string(buf[:n])
	// The test's directory is no dm-verity device (the QEMU boot checks the other answer).
	if !strings.HasPrefix(msg, "READY=1\n") || !strings.Contains(msg, "STATUS=serving 1 repositories, 1 tags") || !strings.Contains(msg, "; 0 of 1 layouts on dm-verity") {
		t.Fatalf("sd_notify message %q", msg)
	}
	// READY means answering: /v2/ must work right now, without retrying.
	resp, err := http.Get("http://" + addr + "/v2/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /v2/ right after READY=1: %v %v", resp, err)
	}
	resp.Body.Close()
	return cmd, msg
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestKilledMidTransfer: SIGKILL during a blob download leaves the client
// with an error, not a short blob; a restarted server serves it whole.
func TestKilledMidTransfer(t *testing.T) {
	dir, layer := bigImage(t, 48<<20)
	addr := freeAddr(t)
	url := "http://" + addr + "/v2/quay.io/acme/big/blobs/" + layer.String()
	cmd, _ := helper(t, addr, dir)
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := io.CopyN(io.Discard, br, 1<<20); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	n, err := io.Copy(io.Discard, br)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("download ended cleanly after the server was killed (%d more bytes)", n)
	}
	helper(t, addr, dir)
	n, err = pullAll(http.DefaultClient, "http://"+addr, "quay.io/acme/big", "1")
	if err != nil || n < 48<<20 {
		t.Fatalf("after restart: %d bytes, %v", n, err)
	}
}

// TestGracefulStop: on SIGTERM the server stops accepting but lets a
// running download finish.
func TestGracefulStop(t *testing.T) {
	dir, layer := bigImage(t, 32<<20)
	addr := freeAddr(t)
	cmd, _ := helper(t, addr, dir)
	resp, err := http.Get("http://" + addr + "/v2/quay.io/acme/big/blobs/" + layer.String())
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(h, resp.Body, 1<<20); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	// The listener closes promptly: poll until a dial is refused (bounded).
	closed := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			closed = true
			break
		}
		c.Close()
	}
	if !closed {
		t.Error("still accepting connections 10 s after SIGTERM")
	}
	if _, err := io.Copy(h, resp.Body); err != nil {
		t.Fatalf("in-flight download broken by SIGTERM: %v", err)
	}
	resp.Body.Close()
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != layer.String() {
		t.Errorf("download finished with digest %s, want %s", got, layer)
	}
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 0 {
			t.Errorf("kiln serve exit after SIGTERM: %v", err)
		}
	}
}
