package base

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
)

func TestMain(m *testing.M) { fixtures.Main(m) }

// A sparse file reads back byte for byte through holeReader, and its holes
// are answered without reading them: the thread that reads passes fewer
// bytes through read(2) than the file holds by the holes' size.
func TestHoleReader(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sparse.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20)
	rand.Read(data)
	// data at 0, 8 MiB and at the very end; holes between.
	for _, at := range []int64{0, 8 << 20, 29 << 20} {
		if _, err := f.WriteAt(data[:1<<20+123], at); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	f, err = os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := newHoleReader(f)
	if err != nil {
		t.Fatal(err)
	}
	// The reads happen on this goroutine, so on this thread alone: its
	// rchar counts them (and nothing of the other tests running).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := readChars(t)
	var got bytes.Buffer
	if _, err := io.CopyBuffer(&got, struct{ io.Reader }{h}, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	read := readChars(t) - before
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("holeReader gave %d bytes that differ from the file's %d", got.Len(), len(want))
	}
	if holes := int64(len(want)) - read; holes < 20<<20 {
		t.Errorf("only %d bytes answered as holes (%d of the %d read); the file has over 20 MiB of them", holes, read, len(want))
	}
}

// readChars is the bytes this thread has passed through read(2) and its
// kin, as /proc/thread-self/io counts them (rchar).
func readChars(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("/proc/thread-self/io says no rchar: %q", b)
	return 0
}
