package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// A cold build from a local layout packs the served blobs from where they
// lie (nothing copied into the cache, the source left as it was) and gives
// the same disk, byte for byte, as a build whose blobs all come from the
// cache.
func TestInPlaceBuildMatchesCachedBuild(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	layoutDir, layer := inPlaceLayer(t, f)
	// A private source file: the partition must still carry it world-readable.
	if err := os.Chmod(layer, 0o600); err != nil {
		t.Fatal(err)
	}

	a := filepath.Join(f.dir, "a.raw")
	log := mustKiln(t, f, "build", f.recipe, "-o", a)
	if !strings.Contains(log, "check blobs read in place: done") {
		t.Errorf("no in-place check in the build's log:\n%s", log)
	}
	cached := filepath.Join(f.cache, "kiln", "blobs", "sha256")
	if _, err := os.Stat(filepath.Join(cached, filepath.Base(layer))); err == nil {
		t.Errorf("layer %s was copied into the cache", filepath.Base(layer))
	}
	if fi, err := os.Stat(layer); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("source layer changed: %v, %v", fi.Mode(), err)
	}
	fsys, c, err := squashfs.OpenImagePartition(a)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := fs.Stat(fsys, "oci/blobs/sha256/"+filepath.Base(layer))
	c.Close()
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("layer on the partition: %v, %v; want mode 0644", fi, err)
	}

	// The same blobs in the cache (as a registry fetch leaves them): the
	// build takes them from there and writes the same bytes.
	blobs, err := os.ReadDir(filepath.Join(layoutDir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range blobs {
		data, err := os.ReadFile(filepath.Join(layoutDir, "blobs", "sha256", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cached, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := filepath.Join(f.dir, "b.raw")
	log = mustKiln(t, f, "build", f.recipe, "-o", b)
	if strings.Contains(log, "check blobs read in place") {
		t.Errorf("blobs read in place although all were cached:\n%s", log)
	}
	if ha, hb := sha256File(t, a), sha256File(t, b); ha != hb {
		t.Fatalf("in place and from the cache, the disks differ: %s vs %s", ha, hb)
	}
}

// A rebuild from an unchanged local layout does not hash its blobs again
// (the cache remembers the files an earlier build found whole, by their
// state); a blob changed since, even with its mtime put back, is hashed and
// refused, and a blob only touched is hashed and accepted.
func TestInPlaceRebuildHashesOnlyWhatChanged(t *testing.T) {
	f := newFixture(t, "base.raw", "fit", "false")
	_, layer := inPlaceLayer(t, f)
	// Files changed within a clock tick of the build are never remembered
	// (filestamp.RacyWindow): let the fixture's files age past it.
	time.Sleep(300 * time.Millisecond)

	a := filepath.Join(f.dir, "a.raw")
	if log := mustKiln(t, f, "build", f.recipe, "-o", a); !strings.Contains(log, "check blobs read in place: done") {
		t.Fatalf("the first build checked nothing in place:\n%s", log)
	}
	b := filepath.Join(f.dir, "b.raw")
	log := mustKiln(t, f, "build", f.recipe, "-o", b)
	if strings.Contains(log, "check blobs read in place") {
		t.Errorf("the rebuild hashed unchanged blobs again:\n%s", log)
	}
	if !strings.Contains(log, keptTreeStep) {
		t.Errorf("the rebuild of the same filesystem hashed its verity tree again:\n%s", log)
	}
	if ha, hb := sha256File(t, a), sha256File(t, b); ha != hb {
		t.Fatalf("the rebuild wrote another disk: %s vs %s", ha, hb)
	}
	mustKiln(t, f, "verify", b)

	// Touched only: hashed again (its state changed), and whole.
	now := time.Now()
	if err := os.Chtimes(layer, now, now); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if log := mustKiln(t, f, "build", f.recipe, "-o", b); !strings.Contains(log, "check blobs read in place: done") || strings.Contains(log, keptTreeStep) {
		t.Errorf("a touched blob was not hashed again, or its verity tree was copied:\n%s", log)
	}

	// Damaged in place, same size, its mtime put back: the ctime moved, so
	// it is hashed, and the build refuses it.
	fi, err := os.Stat(layer)
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, layer, fi.Size()/2)
	if err := os.Chtimes(layer, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(f.dir, "c.raw")
	msg, code := kiln(t, f, "build", f.recipe, "-o", c)
	if code == 0 || !strings.Contains(msg, "the source is damaged or changed") {
		t.Fatalf("a blob damaged after a build that checked it: exit %d\n%s", code, msg)
	}
	if _, err := os.Stat(c); !os.IsNotExist(err) {
		t.Errorf("a disk was written from a damaged blob: %v", err)
	}
}

// keptTreeStep is the step of a build that copies a kept verity tree.
const keptTreeStep = "verity tree kept from an earlier build"

// inPlaceLayer gives f a private local layout (read in place by builds)
// and the path of the served image's first layer in it.
func inPlaceLayer(t *testing.T, f *fixture) (layoutDir, layer string) {
	t.Helper()
	layoutDir = privateLayout(t, f)
	_, _, layers, err := images.Blobs(layoutDir, servedRef)
	if err != nil {
		t.Fatal(err)
	}
	return layoutDir, filepath.Join(layoutDir, "blobs", "sha256", strings.TrimPrefix(layers[0], "sha256:"))
}
