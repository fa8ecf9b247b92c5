package preload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"go.podman.io/storage/pkg/reexec"
)

func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	os.Exit(m.Run())
}

func fixtures(t testing.TB, dir string) ([]Image, []layers.Written) {
	t.Helper()
	oci := filepath.Join(dir, "oci")
	w, err := layers.WriteLayout(oci,
		layers.Spec{Name: "quay.io/kiln/special:1.0", Layers: layers.Special()},
		layers.Spec{Name: "docker.io/library/hello:latest", Layers: layers.Hello()},
		layers.Spec{Name: "quay.io/kiln/undated:1", Layers: layers.Hello(), NoCreated: true},
	)
	if err != nil {
		t.Fatal(err)
	}
	var imgs []Image
	for _, x := range w {
		imgs = append(imgs, Image{Name: x.Name, LayoutDir: oci, Digest: x.Digest.String()})
	}
	return imgs, w
}

// TestReproducible builds the same store twice, at different paths and
// times, and compares the trees entry by entry (content, modes, owners,
// xattrs, mtimes, link targets, hard links).
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	imgs, _ := fixtures(t, dir)
	var listings [][]string
	for i := range 2 {
		store := filepath.Join(dir, fmt.Sprintf("store%d", i))
		if _, err := Build(context.Background(), store, imgs, WithTime(time.Unix(1700000000, 0))); err != nil {
			t.Fatal(err)
		}
		listings = append(listings, treeListing(t, store))
		time.Sleep(1100 * time.Millisecond) // a different wall clock for the second build
	}
	if d := diffListings(listings[0], listings[1]); d != "" {
		t.Errorf("two builds differ:\n%s", d)
	}
}

// recorder is a progress.Reporter that remembers what it was told.
type recorder struct {
	mu    sync.Mutex
	tasks map[string]*recTask
}

type recTask struct {
	total, done int64
	ended       bool
	err         error
}

func (r *recorder) Task(name string, total int64) progress.Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &recTask{total: total}
	r.tasks[name] = t
	return t
}

func (t *recTask) Write(p []byte) (int, error) { t.done += int64(len(p)); return len(p), nil }
func (t *recTask) Done(err error)              { t.ended, t.err = true, err }

// TestResultAndProgress checks what Build reports: one task per image that
// counts the image's bytes and ends cleanly, and a Result matching the lock.
func TestResultAndProgress(t *testing.T) {
	dir := t.TempDir()
	imgs, written := fixtures(t, dir)
	rec := &recorder{tasks: map[string]*recTask{}}
	res, err := Build(context.Background(), filepath.Join(dir, "store"), imgs, WithProgress(rec), WithPlatform("linux", "amd64", ""))
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range written {
		got := res.Images[i]
		if got.Name != w.Name || got.Digest != w.Digest.String() || got.ImageID != w.ConfigID.String() || got.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("result %+v; want %s %s %s", got, w.Name, w.Digest, w.ConfigID)
		}
		task := rec.tasks[w.Name]
		if task == nil || !task.ended || task.err != nil || task.total != got.Size || task.done == 0 || task.done > task.total {
			t.Errorf("progress of %s: %+v; want ended without error, total %d, between 1 and total bytes done", w.Name, task, got.Size)
		}
	}
	size, err := StoreSize(filepath.Join(dir, "store"))
	if err != nil || size != res.Size || size < 4096 {
		t.Errorf("StoreSize = %d, %v; Result.Size %d", size, err, res.Size)
	}
}
