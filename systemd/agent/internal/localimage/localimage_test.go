package localimage

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"go.podman.io/storage/pkg/reexec"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// TestMain lets containers/storage run its layer unpacker as a child of
// the test binary, as kiln's main does.
func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	os.Exit(m.Run())
}

// randomLayout writes a random two-layer image into a new OCI layout and
// returns the layout, its blob directory and the image as kiln.json lists it.
func randomLayout(t *testing.T, name string) (dir string, blobs BlobDirs, im contract.Image) {
	t.Helper()
	dir = t.TempDir()
	_, im, err := images.RandomInLayout(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return dir, BlobDirs{filepath.Join(dir, "blobs")}, im
}

func TestBlobDirsPath(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	for _, p := range []string{filepath.Join(first, "sha256", strings.Repeat("a", 64)), filepath.Join(second, "sha256", strings.Repeat("a", 64)), filepath.Join(second, "sha256", strings.Repeat("b", 64))} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, nil, 0o644)
	}
	dirs := BlobDirs{first, second}
	for _, tc := range []struct {
		d, want, err string
	}{
		{d: a, want: filepath.Join(first, "sha256", strings.Repeat("a", 64))},
		{d: b, want: filepath.Join(second, "sha256", strings.Repeat("b", 64))},
		{d: "sha256:" + strings.Repeat("c", 64), err: "blob sha256:" + strings.Repeat("c", 64) + " is in none of " + first + ", " + second},
		{d: "latest", err: `blob "latest" is not a digest`},
		{d: "sha256:../../etc/passwd", err: "is not a digest"},
		{d: "..:x", err: "is not a digest"},
		{d: "sha256:..", err: "is not a digest"},
		{d: `sha256:a\b`, err: "is not a digest"},
	} {
		got, err := dirs.Path(tc.d)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Path(%q) = %q, %v; want an error containing %q", tc.d, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Path(%q) = %q, %v; want %q", tc.d, got, err, tc.want)
		}
	}
}

// Load gives the store what a pull by containers/image gives it: the same
// layer IDs, the image under its config digest, found by manifest digest
// and by name.
func TestLoadAsAPull(t *testing.T) {
	dir, blobs, im := randomLayout(t, "quay.io/acme/app:1")
	loaded := images.TestStore(t, t.TempDir())
	if err := Load(loaded, im, blobs); err != nil {
		t.Fatal(err)
	}
	pulled := images.TestStore(t, t.TempDir())
	if err := images.CopyToStore(context.Background(), pulled, dir+":app", im.Name); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		what string
		ids  func() ([]string, error)
	}{
		{"Find in the loaded store", func() ([]string, error) { return Find(loaded, im) }},
		{"Find in the pulled store", func() ([]string, error) { return Find(pulled, im) }},
	} {
		ids, err := s.ids()
		if err != nil || !slices.Equal(ids, []string{im.ImageID}) {
			t.Fatalf("%s = %v, %v; want [%s]", s.what, ids, err, im.ImageID)
		}
	}
	a, err := loaded.Image(im.ImageID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pulled.Image(im.ImageID)
	if err != nil {
		t.Fatal(err)
	}
	if a.TopLayer != b.TopLayer || a.TopLayer == "" {
		t.Errorf("top layer %q loaded, %q pulled: Load must use containers/image's layer IDs", a.TopLayer, b.TopLayer)
	}
	if !slices.Equal(a.Names, []string{im.Name}) {
		t.Errorf("loaded image names %v, want [%s]", a.Names, im.Name)
	}
	if byName, err := loaded.Image(im.Name); err != nil || byName.ID != im.ImageID {
		t.Errorf("the loaded image by name: %v, %v", byName, err)
	}
}

// Layers already in the store are kept, not applied again: a second image
// of the same layers loads with their blobs gone.
func TestLoadKeepsLayers(t *testing.T) {
	dir, blobs, im := randomLayout(t, "quay.io/acme/app:1")
	s := images.TestStore(t, t.TempDir())
	if err := Load(s, im, blobs); err != nil {
		t.Fatal(err)
	}
	im2 := relabelled(t, dir, im, "quay.io/acme/app:2")
	_, _, layers, _ := images.Blobs(dir, "app")
	for _, l := range layers {
		os.Remove(blobPath(dir, l))
	}
	if err := Load(s, im2, blobs); err != nil {
		t.Fatalf("loading an image of layers already in the store: %v", err)
	}
	a, _ := s.Image(im.ImageID)
	b, err := s.Image(im2.ImageID)
	if err != nil || a.TopLayer != b.TopLayer {
		t.Fatalf("the second image %v, %v: want it on the first one's top layer %s", b, err, a.TopLayer)
	}
	if ls, _ := s.Layers(); len(ls) != 2 {
		t.Errorf("%d layers in the store, want the 2 the images share", len(ls))
	}
}

// relabelled writes, beside im in the layout dir, an image of the same
// layers with another config, and returns it as kiln.json lists it.
func relabelled(t *testing.T, dir string, im contract.Image, name string) contract.Image {
	t.Helper()
	var m map[string]any
	json.Unmarshal(layoutBlob(t, dir, im.Digest), &m)
	var cfg map[string]any
	cd := m["config"].(map[string]any)
	json.Unmarshal(layoutBlob(t, dir, cd["digest"].(string)), &cfg)
	cfg["author"] = name
	b, _ := json.Marshal(cfg)
	cd["digest"], cd["size"] = writeBlob(t, dir, b), len(b)
	b, _ = json.Marshal(m)
	return contract.Image{Name: name, Digest: writeBlob(t, dir, b), ImageID: strings.TrimPrefix(cd["digest"].(string), "sha256:")}
}

// A name pinned by digest is no name containers/storage can hold.
func TestLoadPinnedName(t *testing.T) {
	_, blobs, im := randomLayout(t, "")
	im.Name = "quay.io/acme/app@" + im.Digest
	s := images.TestStore(t, t.TempDir())
	if err := Load(s, im, blobs); err != nil {
		t.Fatal(err)
	}
	img, err := s.Image(im.ImageID)
	if err != nil || len(img.Names) != 0 {
		t.Fatalf("image %v, %v: want it loaded without names", img, err)
	}
}

// Find goes by manifest digest, then by image ID, never by name.
func TestFind(t *testing.T) {
	_, blobs, im := randomLayout(t, "quay.io/acme/app:1")
	s := images.TestStore(t, t.TempDir())
	if err := Load(s, im, blobs); err != nil {
		t.Fatal(err)
	}
	other := "sha256:" + strings.Repeat("0", 64)
	for _, tc := range []struct {
		name string
		im   contract.Image
		want []string
		err  string
	}{
		{name: "by digest", im: im, want: []string{im.ImageID}},
		{name: "by digest, no image ID", im: contract.Image{Name: im.Name, Digest: im.Digest}, want: []string{im.ImageID}},
		{name: "manifest rewritten: by image ID", im: contract.Image{Name: im.Name, Digest: other, ImageID: "sha256:" + im.ImageID}, want: []string{im.ImageID}},
		{name: "same name, other content", im: contract.Image{Name: im.Name, Digest: other, ImageID: strings.Repeat("1", 64)}},
		{name: "same name, other digest, no image ID", im: contract.Image{Name: im.Name, Digest: other}},
		{name: "not a digest", im: contract.Image{Name: "app", Digest: "latest"}, err: `image app: digest "latest"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, err := Find(s, tc.im)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Find = %v, %v; want an error containing %q", ids, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(ids, tc.want) {
				t.Fatalf("Find = %v, %v; want %v", ids, err, tc.want)
			}
		})
	}
}

// Damaged or inconsistent content is refused, named, and leaves no image.
func TestLoadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func(t *testing.T, dir string, im *contract.Image)
		damaged bool // errors.Is ErrDamaged
		want    string
	}{
		{name: "a corrupt manifest", damaged: true, want: "reads as sha256:", damage: func(t *testing.T, dir string, im *contract.Image) {
			corrupt(t, dir, im.Digest)
		}},
		{name: "a corrupt config", damaged: true, want: "reads as sha256:", damage: func(t *testing.T, dir string, im *contract.Image) {
			_, config, _, _ := images.Blobs(dir, "app")
			corrupt(t, dir, config)
		}},
		{name: "a corrupt layer", damaged: true, want: "layer sha256:", damage: func(t *testing.T, dir string, im *contract.Image) {
			_, _, layers, _ := images.Blobs(dir, "app")
			corrupt(t, dir, layers[1])
		}},
		{name: "a missing layer", want: " is in none of ", damage: func(t *testing.T, dir string, im *contract.Image) {
			_, _, layers, _ := images.Blobs(dir, "app")
			os.Remove(blobPath(dir, layers[0]))
		}},
		{name: "another image ID", damaged: true, want: "names config sha256:", damage: func(t *testing.T, dir string, im *contract.Image) {
			im.ImageID = strings.Repeat("1", 64)
		}},
		{name: "not a manifest", want: "is not an image manifest", damage: func(t *testing.T, dir string, im *contract.Image) {
			im.Digest = writeBlob(t, dir, []byte(`{"schemaVersion":2}`))
			im.ImageID = ""
		}},
		{name: "a manifest larger than any", want: "is larger than a manifest or config may be", damage: func(t *testing.T, dir string, im *contract.Image) {
			im.Digest = writeBlob(t, dir, make([]byte, contract.MaxManifestSize+1))
		}},
		{name: "a layer the config does not list", want: "image config lists 2 layers, the manifest 3", damage: func(t *testing.T, dir string, im *contract.Image) {
			var m map[string]any
			json.Unmarshal(layoutBlob(t, dir, im.Digest), &m)
			ls := m["layers"].([]any)
			m["layers"] = append(ls, ls[0])
			b, _ := json.Marshal(m)
			im.Digest = writeBlob(t, dir, b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, blobs, im := randomLayout(t, "quay.io/acme/app:1")
			tc.damage(t, dir, &im)
			s := images.TestStore(t, t.TempDir())
			err := Load(s, im, blobs)
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrDamaged) != tc.damaged {
				t.Fatalf("Load = %v; want an error containing %q (damaged: %v)", err, tc.want, tc.damaged)
			}
			if imgs, _ := s.Images(); len(imgs) != 0 {
				t.Errorf("a refused load left images %v", imgs)
			}
		})
	}
}

func blobPath(dir, d string) string {
	return filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
}

func corrupt(t *testing.T, dir, d string) {
	t.Helper()
	if err := images.CorruptBlob(dir, d); err != nil {
		t.Fatal(err)
	}
}

func layoutBlob(t *testing.T, dir, d string) []byte {
	t.Helper()
	b, err := os.ReadFile(blobPath(dir, d))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeBlob(t *testing.T, dir string, b []byte) string {
	t.Helper()
	d := digest.FromBytes(b).String()
	if err := os.WriteFile(blobPath(dir, d), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}
