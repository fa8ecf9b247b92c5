package release

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/agent/firstboot"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

func randomLayout(t *testing.T, name string) (string, contract.Image) {
	t.Helper()
	ref, im, err := images.RandomInLayout(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	return ref, im
}

// Retired images leave the node's main store (layers and all); one a
// container still uses is kept and said so; one only in the read-only
// preloaded store, or already gone, is no error.
func TestStorageImagesRemove(t *testing.T) {
	ctx := context.Background()
	refOld, old := randomLayout(t, "quay.io/acme/app:1.0")
	refUsed, used := randomLayout(t, "quay.io/acme/tool:1.0")
	refPre, pre := randomLayout(t, "quay.io/acme/base:1")
	_, gone := randomLayout(t, "quay.io/acme/gone:1")

	preRoot := t.TempDir()
	preStore := images.TestStore(t, preRoot)
	if err := images.CopyToStore(ctx, preStore, refPre, pre.Name); err != nil {
		t.Fatal(err)
	}
	preStore.Shutdown(true)
	onPartition := filepath.Join(t.TempDir(), "storage")
	if out, err := exec.Command("cp", "-a", filepath.Join(preRoot, "graph"), onPartition).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}

	root := t.TempDir()
	store := images.TestStore(t, root, onPartition)
	for ref, im := range map[string]contract.Image{refOld: old, refUsed: used} {
		if err := images.CopyToStore(ctx, store, ref, im.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.CreateContainer("", []string{"tool"}, used.ImageID, "", "", nil); err != nil {
		t.Fatal(err)
	}
	layersBefore, _ := store.Layers()

	var log bytes.Buffer
	rm := StorageImages{Open: func() (storage.Store, error) { return store, nil }, Log: &log}
	if err := rm.RemoveImages(ctx, []contract.Image{old, used, pre, gone}); err != nil {
		t.Fatal(err)
	}
	missing, err := firstboot.Missing(store, []contract.Image{old, used, pre})
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0].Name != old.Name {
		t.Errorf("missing after removal: %v, want only %s", missing, old.Name)
	}
	if layersAfter, _ := store.Layers(); len(layersAfter) != len(layersBefore)-2 {
		t.Errorf("%d layers before, %d after; want the removed image's 2 gone", len(layersBefore), len(layersAfter))
	}
	if !strings.Contains(log.String(), "kept quay.io/acme/tool:1.0") || !strings.Contains(log.String(), "removed quay.io/acme/app:1.0") {
		t.Errorf("log:\n%s", log.String())
	}
	// Again: nothing left to do, no error.
	if err := rm.RemoveImages(ctx, []contract.Image{old}); err != nil {
		t.Errorf("removing again: %v", err)
	}
}
