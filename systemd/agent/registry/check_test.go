package registry

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// changedBlob is a served layout whose one layer the test changes on disk.
type changedBlob struct {
	url, path string // the layer's URL and file
	digest    string
	good      []byte
	logs      *syncBuffer
}

func newChangedBlob(t *testing.T, size int) *changedBlob {
	dir, layer := bigImage(t, size)
	log, logs := testLogger()
	c := &changedBlob{path: filepath.Join(dir, "blobs", "sha256", layer.Hex), digest: layer.String(), logs: logs}
	c.good = must(os.ReadFile(c.path))
	c.url = "http://" + serve(t, must(New([]string{dir}, WithLogger(log)))) + "/v2/quay.io/acme/big/blobs/" + c.digest
	return c
}

// change flips one byte of the file in place (same size: only the content
// differs); undo writes it back.
func (c *changedBlob) change(t *testing.T, at int) { c.writeByte(t, at, c.good[at]^0xff) }
func (c *changedBlob) undo(t *testing.T, at int)   { c.writeByte(t, at, c.good[at]) }

func (c *changedBlob) writeByte(t *testing.T, at int, b byte) {
	t.Helper()
	f := must(os.OpenFile(c.path, os.O_WRONLY, 0))
	defer f.Close()
	if _, err := f.WriteAt([]byte{b}, int64(at)); err != nil {
		t.Fatal(err)
	}
}

// fetch GETs the blob (a Range when rng is set) and returns the status, the
// body and the error that ended it (nil for a complete body).
func (c *changedBlob) fetch(t *testing.T, rng string) (int, []byte, error) {
	t.Helper()
	req := must(http.NewRequest(http.MethodGet, c.url, nil))
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// mustRefuse checks that a request for the changed blob gets no wrong byte
// it could keep: a 500 naming the damage, or a transfer broken before its
// end (when the change is found while the blob streams).
func (c *changedBlob) mustRefuse(t *testing.T, rng string, want500 bool) {
	t.Helper()
	status, body, err := c.fetch(t, rng)
	switch {
	case status == http.StatusInternalServerError:
		if apiErrorCode(body) != codeUnknown || !strings.Contains(string(body), "damaged") {
			t.Errorf("Range %q: 500 with body %s, want an UNKNOWN error saying the blob is damaged", rng, body)
		}
	case want500:
		t.Errorf("Range %q: status %d, %d bytes, err %v; want 500", rng, status, len(body), err)
	case err == nil:
		t.Errorf("Range %q: status %d and a complete body of %d bytes from a changed blob", rng, status, len(body))
	}
}

// mustLog checks that the log names the blob's digest and file in a line
// saying what.
func (c *changedBlob) mustLog(t *testing.T, what string) {
	t.Helper()
	for _, line := range strings.Split(c.logs.String(), "\n") {
		if strings.Contains(line, what) && strings.Contains(line, c.path) && strings.Contains(line, c.digest) {
			return
		}
	}
	t.Errorf("no log line saying %q with file %s and digest %s:\n%s", what, c.path, c.digest, c.logs)
}

// TestChangedBlob: a blob file on a filesystem that is not dm-verity
// (here the test's ext4 or tmpfs) is never served with bytes that were not
// checked against its digest (issue 26): not after a first full read
// checked it and the file changed, not by a Range read before any full
// read. A change gives an error (500, or a transfer cut before its last
// byte when found while streaming) and a log line naming the digest and
// the file; putting the right bytes back serves the blob again.
func TestChangedBlob(t *testing.T) {
	const size = 4 << 20
	mid := fmt.Sprintf("bytes=%d-%d", size/2, size/2+99)
	t.Run("changed after the first full read", func(t *testing.T) {
		c := newChangedBlob(t, size)
		if status, body, err := c.fetch(t, ""); status != 200 || err != nil || !bytes.Equal(body, c.good) {
			t.Fatalf("first GET: %d, %v", status, err)
		}
		c.change(t, size-10)
		c.mustRefuse(t, "", false) // found while it streams: cut before the last byte
		c.mustLog(t, "blob file changed since it was checked")
		c.mustLog(t, "content does not match its digest")
		c.mustRefuse(t, "", true) // known now: 500 at once
		c.mustRefuse(t, mid, true)
		c.undo(t, size-10)
		if status, body, err := c.fetch(t, ""); status != 200 || err != nil || !bytes.Equal(body, c.good) {
			t.Errorf("GET once the right bytes are back: %d, %v", status, err)
		}
	})
	t.Run("Range before any full read", func(t *testing.T) {
		c := newChangedBlob(t, size)
		c.change(t, 5) // far from the range asked for
		c.mustRefuse(t, mid, true)
		c.mustLog(t, "content does not match its digest")
		c.mustRefuse(t, "", true)
	})
	t.Run("Range after the first full read", func(t *testing.T) {
		c := newChangedBlob(t, size)
		if status, _, err := c.fetch(t, ""); status != 200 || err != nil {
			t.Fatalf("first GET: %d, %v", status, err)
		}
		if status, body, err := c.fetch(t, mid); status != 206 || err != nil || !bytes.Equal(body, c.good[size/2:size/2+100]) {
			t.Fatalf("Range of the checked blob: %d, %v", status, err)
		}
		c.change(t, 5)
		c.mustRefuse(t, mid, true)
		c.mustLog(t, "blob file changed since it was checked")
	})
	t.Run("changed while being sent", func(t *testing.T) {
		c := newChangedBlob(t, 64<<20)
		if status, _, err := c.fetch(t, ""); status != 200 || err != nil {
			t.Fatalf("first GET: %d, %v", status, err)
		}
		resp, err := http.Get(c.url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if _, err := io.CopyN(io.Discard, resp.Body, 1<<20); err != nil {
			t.Fatal(err)
		}
		c.change(t, 64<<20-10)
		if n, err := io.Copy(io.Discard, resp.Body); err == nil {
			t.Errorf("the blob changed while being sent, and its body ended cleanly after %d more bytes", n)
		}
		c.mustLog(t, "blob file changed while it was being sent")
	})
}

// TestRangeOfUncheckedBlob: a Range of a blob no request has checked yet
// hashes it first, then serves the range, and keeps the check, bound to
// the file's stamp.
func TestRangeOfUncheckedBlob(t *testing.T) {
	dir, layer := bigImage(t, 1<<20)
	s := must(New([]string{dir}, WithLogger(quiet)))
	if ck, ok := s.checkOf(layer.String()); ok {
		t.Fatalf("a new server knows a check already: %+v", ck)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v2/quay.io/acme/big/blobs/"+layer.String(), nil)
	req.Header.Set("Range", "bytes=10-19")
	s.ServeHTTP(rec, req)
	ck, ok := s.checkOf(layer.String())
	fi := must(os.Stat(filepath.Join(dir, "blobs", "sha256", layer.Hex)))
	if rec.Code != 206 || rec.Body.Len() != 10 || !ok || !ck.ok || ck.stamp != stampOf(fi) {
		t.Errorf("after a Range: %d with %d bytes, check %+v (known %v); want 206, 10 bytes and a passed check bound to the file's stamp",
			rec.Code, rec.Body.Len(), ck, ok)
	}
}

// TestBlobOnRamfs: on a filesystem whose ctime is not known to move with
// every write (ramfs here; FUSE, network and overlay filesystems alike) no
// check is kept: every GET is hashed as it streams, and a Range is answered
// with the whole blob (hashed), as RFC 9110 lets a server do.
func TestBlobOnRamfs(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Fatalf("mount ramfs (the tests run as root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	src, layer := bigImage(t, 1<<20)
	if out, err := exec.Command("cp", "-a", src, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	log, logs := testLogger()
	base := "http://" + serve(t, must(New([]string{filepath.Join(dir, "oci")}, WithLogger(log)))) + "/v2/quay.io/acme/big/blobs/" + layer.String()
	resp, body := get(t, "GET", base, map[string]string{"Range": "bytes=0-9"})
	if resp.StatusCode != 200 || len(body) != 1<<20 {
		t.Errorf("Range on ramfs: %d with %d bytes, want 200 and the whole blob", resp.StatusCode, len(body))
	}
	p := filepath.Join(dir, "oci", "blobs", "sha256", layer.Hex)
	f := must(os.OpenFile(p, os.O_WRONLY, 0))
	f.WriteAt([]byte("!"), 100)
	f.Close()
	for i := 0; i < 2; i++ { // each GET hashed: each one cut short
		resp, err := http.Get(base)
		if err != nil {
			continue // Go's client may have retried into a refused connection
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Errorf("GET %d of a changed blob on ramfs: status %d, %d bytes, complete", i, resp.StatusCode, n)
		}
	}
	if n := strings.Count(logs.String(), "content does not match its digest"); n < 2 {
		t.Errorf("%d damage lines, want one per GET (two, or more if Go's client retried):\n%s", n, logs)
	}
}

// TestTrustOf: where the registry trusts a blob file between reads. A
// dm-verity device is recognised by its device-mapper UUID in sysfs
// (CRYPT-VERITY-…, as veritysetup names it); the tree here stands in for
// /sys on a machine without device-mapper (the QEMU boot test proves it on
// a real node: the registry's READY status says the partition is on
// dm-verity).
func TestTrustOf(t *testing.T) {
	dir := t.TempDir()
	f := must(os.Open(dir))
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	sysfs := t.TempDir()
	uuidFile := filepath.Join(sysfs, "dev", "block", fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)), "dm", "uuid")
	os.MkdirAll(filepath.Dir(uuidFile), 0o755)
	for _, tc := range []struct {
		name, uuid string
		want       trust
	}{
		{"not device-mapper", "", stamped},
		{"veritysetup's device", "CRYPT-VERITY-1c5fd7e2d2d04bb58a6a2bd1bb0b6d1d-kiln-images\n", verity},
		{"dm-crypt", "CRYPT-LUKS2-1c5fd7e2d2d04bb58a6a2bd1bb0b6d1d-data\n", stamped},
		{"LVM", "LVM-Xw0XGl5Tb1Kq\n", stamped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(uuidFile)
			if tc.uuid != "" {
				os.WriteFile(uuidFile, []byte(tc.uuid), 0o644)
			}
			tr := &trustOf{sysfs: sysfs}
			if got := tr.of(f, uint64(st.Dev)); got != tc.want {
				t.Errorf("trust %d, want %d", got, tc.want)
			}
		})
	}
}
