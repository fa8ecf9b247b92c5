package firstboot

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// fixture writes an OCI layout with one random image and returns its
// layout reference and the image as kiln.json would list it.
func fixture(t *testing.T) (string, contract.Image) {
	t.Helper()
	ref, im, err := images.RandomInLayout(t.TempDir(), "quay.io/acme/app:1.2")
	if err != nil {
		t.Fatal(err)
	}
	return ref, im
}

func openStore(t *testing.T, root string, additional ...string) storage.Store {
	return images.TestStore(t, root, additional...)
}

// copyIn copies the layout's image into the store under name, as a pull
// by CRI-O or podman would.
func copyIn(t *testing.T, store storage.Store, ref, name string) {
	t.Helper()
	if err := images.CopyToStore(context.Background(), store, ref, name); err != nil {
		t.Fatal(err)
	}
}

func TestPresentInMainStore(t *testing.T) {
	dir, im := fixture(t)
	store := openStore(t, t.TempDir())
	copyIn(t, store, dir, im.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var log bytes.Buffer
	if err := Wait(ctx, store, []contract.Image{im}, 100*time.Millisecond, &log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "all 1 image(s) are in local storage") {
		t.Errorf("log: %s", log.String())
	}
	// Found by ID alone too (a manifest rewritten on the way in keeps its config).
	byID := contract.Image{Name: im.Name, Digest: "sha256:" + strings.Repeat("1", 64), ImageID: im.ImageID}
	if m, err := Missing(store, []contract.Image{byID}); err != nil || len(m) != 0 {
		t.Errorf("by image ID: missing %v, %v", m, err)
	}
}

// The preloaded store is an additional, read-only image store of the main one.
func TestPresentInAdditionalStore(t *testing.T) {
	dir, im := fixture(t)
	preRoot := t.TempDir()
	pre := openStore(t, preRoot)
	copyIn(t, pre, dir, im.Name)
	pre.Shutdown(true)
	// Copy it elsewhere, as the builder puts it on the partition: this
	// process still caches the original's locks as read-write.
	onPartition := filepath.Join(t.TempDir(), "storage")
	if out, err := exec.Command("cp", "-a", filepath.Join(preRoot, "graph"), onPartition).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}

	main := openStore(t, t.TempDir(), onPartition)
	if m, err := Missing(main, []contract.Image{im}); err != nil || len(m) != 0 {
		t.Fatalf("image in the additional store: missing %v, %v", m, err)
	}
}

func TestAbsentTimesOut(t *testing.T) {
	dir, im := fixture(t)
	store := openStore(t, t.TempDir())
	copyIn(t, store, dir, im.Name)
	// Another image under a name that is present must not count: only the
	// digest (or ID) does.
	absent := contract.Image{Name: im.Name, Digest: "sha256:" + strings.Repeat("2", 64)}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Wait(ctx, store, []contract.Image{im, absent}, 100*time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 image(s) are still not in local storage: quay.io/acme/app:1.2@sha256:2222") {
		t.Fatalf("Wait error = %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("not bounded: %s", d)
	}
}

// An image that arrives while waiting (a pull through the mirror) ends the wait.
func TestArrivesWhileWaiting(t *testing.T) {
	dir, im := fixture(t)
	root := t.TempDir()
	store := openStore(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	log := &lineSignal{seen: make(chan struct{})}
	go func() { done <- Wait(ctx, store, []contract.Image{im}, 100*time.Millisecond, log) }()
	select { // Wait has looked, and found the image missing
	case <-log.seen:
	case err := <-done:
		t.Fatalf("Wait returned before the image arrived: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Wait returned before the image arrived: %v", err)
	default:
	}
	copyIn(t, store, dir, im.Name)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestMarker(t *testing.T) {
	got := []contract.Image{{Name: "a", Digest: "sha256:x", ImageID: "sha256:abc"}}
	marker := filepath.Join(t.TempDir(), "kiln", "firstboot.done")
	if err := MarkDone(marker, got); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal(err)
	}
}

// lineSignal closes seen at the first write: Wait logs once it has looked.
type lineSignal struct {
	once sync.Once
	seen chan struct{}
}

func (l *lineSignal) Write(p []byte) (int, error) {
	l.once.Do(func() { close(l.seen) })
	return len(p), nil
}
