//go:build !nodeonly

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// TestRestoreImages: on a node that confirmed an upgrade (1.1 current, the
// factory's 1.0 previous), the runtime's store is removed as CRI-O removes
// it after an unclean shutdown; `kiln agent restore-images` puts every image
// the node keeps back from the image partition and the release store, each
// found by digest by podman; a second run restores nothing; on a boot that
// runs the registry the served-only images are left to it; a damaged stored
// blob is never loaded, and the run fails naming the image and what to do.
func TestRestoreImages(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", releaseFiles)
	r11 := preloadApp(t, rs.recipe(t, "acme", "1.1.0", releaseFiles))
	disk10 := filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10)
	rs.mustKiln(t, "lock", r11)
	b11 := filepath.Join(rs.dir, "upgrade-1.1.kbundle")
	rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key, "--from", disk10, "--format", "file")

	n := newImportNode(t, disk10, rs.pub)
	n.mustKiln(t, rs, "agent", "import", b11)
	n.mustRelease(t, rs, "begin")
	n.mustRelease(t, rs, "confirm", "1.1.0")
	s := n.state(t)
	if s.Current.Version != "1.1.0" || s.Previous == nil || s.Previous.Version != "1.0.0" {
		t.Fatalf("state: %+v", s)
	}
	kept := map[string]contract.Image{} // by digest: current and previous
	for _, r := range []contract.Release{s.Current, *s.Previous} {
		for _, im := range r.Images {
			kept[im.Digest] = im
		}
	}
	if len(kept) != 3 {
		t.Fatalf("the releases keep %d images, want 3 (base:1, app:1.0, app:1.1)", len(kept))
	}
	app11 := s.Current.Images[0]
	for _, im := range s.Current.Images {
		if strings.HasPrefix(im.Name, appImage) {
			app11 = im
		}
	}
	graph := filepath.Join(n.root, "var/lib/containers/storage")
	wipe := func(t *testing.T) {
		t.Helper()
		if err := os.RemoveAll(graph); err != nil {
			t.Fatal(err)
		}
	}
	restore := func(t *testing.T) (string, int) {
		t.Helper()
		return rs.kiln(t, "agent", "restore-images", "--root", n.root)
	}
	marker := filepath.Join(n.root, contract.FirstBootMarker)
	os.MkdirAll(filepath.Dir(marker), 0o755)
	if err := os.WriteFile(marker, []byte("done\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	status := func(t *testing.T) string {
		t.Helper()
		out, code := rs.kiln(t, "agent", "status", "--root", n.root)
		if code != 0 {
			t.Fatalf("status: exit %d\n%s", code, out)
		}
		return out
	}

	t.Run("everything the releases keep comes back", func(t *testing.T) {
		wipe(t)
		if out := status(t); !strings.Contains(out, "images:   MISSING 3 of 3 image(s) the node keeps from local storage") || !strings.Contains(out, app11.Name+"@"+app11.Digest) {
			t.Errorf("status after the wipe does not say what is missing:\n%s", out)
		}
		out, code := restore(t)
		t.Logf("%s", out)
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		for _, want := range []string{
			"3 of 3 image(s) the node keeps are not in local storage",
			"restored " + app11.Name + "@" + app11.Digest + " from " + filepath.Join(n.root, contract.ReleaseStore, "blobs"),
			"restored " + baseImage + "@",
			"restored 3 image(s); all 3 image(s) the node keeps are in local storage",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
		n.checkPodmanImages(t, kept)
		if out := status(t); !strings.Contains(out, "images:   all 3 image(s) the node keeps are in local storage") {
			t.Errorf("status after the restore:\n%s", out)
		}

		// A running container's layers stay mounted: the restore and the
		// status still work on a node that runs its workloads.
		n.podman(t, "create", "--name", "running", app11.Name)
		n.podman(t, "mount", "running")
		defer n.podman(t, "rm", "-f", "running")
		out, code = restore(t)
		if code != 0 || !strings.Contains(out, "all 3 image(s) the node keeps are in local storage") || strings.Contains(out, "restored") {
			t.Errorf("second run, a container mounted: exit %d\n%s", code, out)
		}
		if out := status(t); !strings.Contains(out, "images:   all 3 image(s) the node keeps are in local storage") {
			t.Errorf("status with a container mounted:\n%s", out)
		}
	})

	t.Run("a boot that runs the registry leaves served-only images to it", func(t *testing.T) {
		wipe(t)
		os.Remove(marker)
		defer os.WriteFile(marker, []byte("done\n"), 0o644)
		out, code := restore(t)
		if code != 0 || !strings.Contains(out, "1 of 1 image(s) the node keeps are not in local storage") ||
			!strings.Contains(out, "restored "+app11.Name+"@") {
			t.Errorf("first boot: exit %d\n%s", code, out)
		}
	})

	t.Run("a damaged stored blob is refused", func(t *testing.T) {
		wipe(t)
		var layer string
		for _, b := range s.Current.Blobs {
			p := filepath.Join(n.root, contract.ReleaseStore, "blobs", "sha256", strings.TrimPrefix(b, "sha256:"))
			if fi, err := os.Stat(p); err == nil && fi.Size() > 100<<10 {
				layer = p // a layer of app:1.1 (300 KiB), not a manifest
			}
		}
		if layer == "" {
			t.Fatal("no layer of 1.1 in the release store")
		}
		flipByte(t, layer, 1000)
		defer flipByte(t, layer, 1000)
		out, code := restore(t)
		t.Logf("%s", out)
		if code != 1 || !strings.Contains(out, "cannot restore "+app11.Name+"@"+app11.Digest) ||
			!strings.Contains(out, "plug in the upgrade stick of this release again") {
			t.Errorf("exit %d", code)
		}
		f := releaseFlags{root: n.root}
		store, err := f.openStore()
		if err != nil {
			t.Fatal(err)
		}
		defer store.Shutdown(true)
		if found, _ := store.ImagesByDigest(digest.Digest(app11.Digest)); len(found) != 0 {
			t.Errorf("the damaged image is in the store: %v", found)
		}
		for d, im := range kept {
			if d == app11.Digest {
				continue
			}
			if found, err := store.ImagesByDigest(digest.Digest(d)); err != nil || len(found) != 1 {
				t.Errorf("%s was not restored beside the damaged one: %v %v", im.Name, found, err)
			}
		}
	})
}
