package registry

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// upgradeNode is a node during an upgrade boot, as the release state and
// the bundle import leave it:
//
//	partition (OCI layout)   quay.io/acme/app:1.0 and :stable = old, layers shared + gone
//	release store            1.1's app (:1.1, :stable): manifest, config, layer fresh;
//	                         1.1's tool: manifest, config, layer orphan (not listed by 1.1);
//	                         stray: a blob no release lists and no manifest references
//	nowhere                  1.1's tool layer lost (listed by 1.1, in neither place)
//
// shared is only on the partition: the import does not copy what the
// partition has, so 1.1's app is whole only from both places.
type upgradeNode struct {
	partition, store, state string
	old, app, tool          v1.Image
	shared, fresh           v1.Layer
	orphan, lost, stray     v1.Hash
	oldRel, newRel          contract.Release
}

func layer(t testing.TB, size int64) v1.Layer {
	t.Helper()
	return must(random.Layer(size, types.OCILayer))
}

func imageOf(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	return withPlatform(t, must(mutate.AppendLayers(img, layers...)), "amd64")
}

func digestOf(t testing.TB, img v1.Image) string { t.Helper(); return must(img.Digest()).String() }

func newUpgradeNode(t testing.TB) *upgradeNode {
	t.Helper()
	root := t.TempDir()
	n := &upgradeNode{
		partition: filepath.Join(root, "images", "oci"),
		store:     filepath.Join(root, "releases"),
		state:     filepath.Join(root, "state.json"),
	}
	n.shared, n.fresh = layer(t, 3000), layer(t, 2000)
	n.old = imageOf(t, n.shared, layer(t, 1000))
	n.app = imageOf(t, n.shared, n.fresh)
	orphan, lost := layer(t, 500), layer(t, 700)
	n.orphan, n.lost = must(orphan.Digest()), must(lost.Digest())
	n.tool = imageOf(t, n.shared, orphan, lost)

	p := must(layout.Write(n.partition, empty.Index))
	for _, name := range []string{"quay.io/acme/app:1.0", "quay.io/acme/app:stable"} {
		if err := p.AppendImage(n.old, refName(name)); err != nil {
			t.Fatal(err)
		}
	}
	blobs := filepath.Join(n.store, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(b []byte) string {
		h, _, _ := v1.SHA256(strings.NewReader(string(b)))
		if err := os.WriteFile(filepath.Join(blobs, h.Hex), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return h.String()
	}
	putLayer := func(l v1.Layer) string {
		rc := must(l.Compressed())
		defer rc.Close()
		b := must(io.ReadAll(rc))
		return put(b)
	}
	n.newRel = contract.Release{Version: "1.1.0", Blobs: []string{
		put(must(n.app.RawManifest())), put(must(n.app.RawConfigFile())), putLayer(n.fresh),
		put(must(n.tool.RawManifest())), put(must(n.tool.RawConfigFile())),
	}}
	putLayer(orphan) // in the store, but 1.1 does not list it
	n.newRel.Blobs = append(n.newRel.Blobs, n.lost.String())
	n.stray = must(v1.NewHash(put([]byte("a file no release lists\n"))))
	for _, im := range []struct {
		name string
		img  v1.Image
	}{{"quay.io/acme/app:1.1", n.app}, {"quay.io/acme/app:stable", n.app}, {"quay.io/acme/tool:1.1", n.tool}} {
		n.newRel.Images = append(n.newRel.Images, contract.Image{Name: im.name, Digest: digestOf(t, im.img),
			MediaType: string(types.OCIManifestSchema1), Served: true})
	}
	n.oldRel = contract.Release{Version: "1.0.0", Images: []contract.Image{
		{Name: "quay.io/acme/app:1.0", Digest: digestOf(t, n.old), MediaType: string(types.OCIManifestSchema1), Served: true},
		{Name: "quay.io/acme/app:stable", Digest: digestOf(t, n.old), MediaType: string(types.OCIManifestSchema1), Served: true},
	}}
	n.writeState(t, state.State{Current: n.oldRel, Trying: &n.newRel, Attempts: 1})
	return n
}

func (n *upgradeNode) writeState(t testing.TB, s state.State) {
	t.Helper()
	s.SchemaVersion = state.Version
	if err := os.WriteFile(n.state, must(state.Encode(&s)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (n *upgradeNode) serve(t *testing.T) (base string, logs *syncBuffer) {
	t.Helper()
	log, logs := testLogger()
	s, err := New([]string{n.partition}, WithLogger(log), WithReleaseState(n.state, n.store))
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, s), logs
}

// TestReleaseSkopeo: the release being tried is pulled by skopeo through
// the registry, by tag and by digest, its blobs from the release store and
// the shared layer from the partition, and every byte verifies.
func TestReleaseSkopeo(t *testing.T) {
	n := newUpgradeNode(t)
	addr, _ := n.serve(t)
	env := clientEnv(t, "")
	policy := strings.TrimPrefix(env[len(env)-4], "POLICY=")
	want := must(n.app.Digest())
	for _, ref := range []string{"quay.io/acme/app:1.1", "quay.io/acme/app@" + want.String(), "quay.io/acme/app:stable"} {
		t.Run(ref, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "dir")
			run(t, env, "skopeo", "copy", "--policy", policy, "--src-tls-verify=false", "docker://"+addr+"/"+ref, "dir:"+dest)
			checkDirCopy(t, dest, want)
			for _, l := range []v1.Layer{n.shared, n.fresh} {
				if _, err := os.Stat(filepath.Join(dest, must(l.Digest()).Hex)); err != nil {
					t.Errorf("layer %s not copied: %v", must(l.Digest()), err)
				}
			}
		})
	}
}

// TestReleaseServesOnlyWhatItLists: a file in the store no release lists
// is never served, even when a served manifest references it; a blob the
// release lists but nobody has is a 404 with a log line that says what to
// do, and the rest of that image is still served.
func TestReleaseServesOnlyWhatItLists(t *testing.T) {
	n := newUpgradeNode(t)
	addr, logs := n.serve(t)
	base := "http://" + addr + "/v2/quay.io/acme/tool/blobs/"
	toolCfg := must(n.tool.ConfigName())
	for _, tc := range []struct {
		name   string
		digest v1.Hash
		status int
	}{
		{"stray store file", n.stray, 404},
		{"store file the release does not list", n.orphan, 404},
		{"listed, in neither place", n.lost, 404},
		{"config from the store", toolCfg, 200},
		{"shared layer from the partition", must(n.shared.Digest()), 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{"GET", "HEAD"} {
				resp, body := get(t, method, base+tc.digest.String(), nil)
				if resp.StatusCode != tc.status {
					t.Errorf("%s: status %d, want %d", method, resp.StatusCode, tc.status)
				}
				if tc.status == 200 {
					if h, _, _ := v1.SHA256(strings.NewReader(string(body))); method == "GET" && h != tc.digest {
						t.Errorf("GET: body hashes to %s", h)
					}
				} else if method == "GET" && apiErrorCode(body) != codeBlobUnknown {
					t.Errorf("GET: body %s, want BLOB_UNKNOWN", body)
				}
			}
		})
	}
	for _, want := range []string{
		"blob is neither in the release store nor on the image partition: it is not served (404); roll the release back",
		"digest=" + n.lost.String(),
		"digest=" + n.orphan.String(),
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs.String(), "sha256/"+n.stray.Hex) { // its file
		t.Errorf("the stray file was looked at:\n%s", logs)
	}
}

// TestReleaseTagClash: the release being tried wins a tag the partition
// also has; the partition's image stays pullable by digest and by its own
// tag. Once confirmed (1.1 current, 1.0 previous) the same holds; with no
// state file, only the partition is served. The partition's layout is
// indexed at start or comes with the factory's prebuilt index.
func TestReleaseTagClash(t *testing.T) {
	for _, mode := range indexModes {
		t.Run(mode.name, func(t *testing.T) { testReleaseTagClash(t, mode) })
	}
}

func testReleaseTagClash(t *testing.T, mode indexMode) {
	n := newUpgradeNode(t)
	mode.prepare(t, n.partition)
	check := func(t *testing.T, stable string, newServed bool) {
		addr, logs := n.serve(t)
		base := "http://" + addr + "/v2/quay.io/acme/app/manifests/"
		resp, _ := get(t, "GET", base+"stable", nil)
		if got := resp.Header.Get("Docker-Content-Digest"); got != stable {
			t.Errorf("app:stable served as %s, want %s", got, stable)
		}
		for ref, want := range map[string]int{"1.0": 200, digestOf(t, n.old): 200, "1.1": 404, digestOf(t, n.app): 404} {
			if newServed && want == 404 {
				want = 200
			}
			if resp, _ := get(t, "HEAD", base+ref, nil); resp.StatusCode != want {
				t.Errorf("HEAD app manifest %s: %d, want %d", ref, resp.StatusCode, want)
			}
		}
		resp, body := get(t, "GET", "http://"+addr+"/v2/quay.io/acme/app/tags/list", nil)
		var tags struct{ Tags []string }
		json.Unmarshal(body, &tags)
		wantTags := []string{"1.0", "stable"}
		if newServed {
			wantTags = []string{"1.0", "1.1", "stable"}
		}
		if resp.StatusCode != 200 || !slices.Equal(tags.Tags, wantTags) {
			t.Errorf("tags %d %v, want %v", resp.StatusCode, tags.Tags, wantTags)
		}
		if newServed && !strings.Contains(logs.String(), "the first source wins it") {
			t.Errorf("the clash is not logged:\n%s", logs)
		}
	}
	t.Run("trying", func(t *testing.T) { check(t, digestOf(t, n.app), true) })
	t.Run("confirmed", func(t *testing.T) {
		n.writeState(t, state.State{Current: n.newRel, Previous: &n.oldRel})
		check(t, digestOf(t, n.app), true)
	})
	t.Run("staged only", func(t *testing.T) {
		n.writeState(t, state.State{Current: n.oldRel, Staged: &n.newRel})
		check(t, digestOf(t, n.old), false)
	})
	t.Run("no state", func(t *testing.T) {
		os.Remove(n.state)
		check(t, digestOf(t, n.old), false)
	})
}

// TestReleaseStoreHardening: a listed blob that is a symlink in the store
// is never followed; a store whose blobs directory is a symlink, or a
// state file that is one or is not JSON, fails the start naming it.
func TestReleaseStoreHardening(t *testing.T) {
	t.Run("blob symlink", func(t *testing.T) {
		n := newUpgradeNode(t)
		p := filepath.Join(n.store, "blobs", "sha256", must(n.fresh.Digest()).Hex)
		os.Rename(p, p+".moved")
		if err := os.Symlink(p+".moved", p); err != nil {
			t.Fatal(err)
		}
		addr, logs := n.serve(t)
		resp, _ := get(t, "GET", "http://"+addr+"/v2/quay.io/acme/app/blobs/"+must(n.fresh.Digest()).String(), nil)
		if resp.StatusCode != 404 || !strings.Contains(logs.String(), "blob file is not a regular file: not served; the release store on /var is damaged") {
			t.Errorf("status %d, want 404 and a log line:\n%s", resp.StatusCode, logs)
		}
	})
	for _, tc := range []struct {
		name  string
		setup func(n *upgradeNode)
		want  string
	}{
		{"blobs dir symlink", func(n *upgradeNode) {
			d := filepath.Join(n.store, "blobs", "sha256")
			os.Rename(d, d+".moved")
			os.Symlink(d+".moved", d)
		}, "blobs/sha256 is not a directory"},
		{"state symlink", func(n *upgradeNode) {
			os.Rename(n.state, n.state+".moved")
			os.Symlink(n.state+".moved", n.state)
		}, "not a regular file"},
		{"state not JSON", func(n *upgradeNode) { os.WriteFile(n.state, []byte("{"), 0o644) }, "parse release state"},
		// Sparse: its size, not its bytes, is what is refused.
		{"state over the limit", func(n *upgradeNode) { os.Truncate(n.state, 64<<20+1) }, "is 67108865 bytes, over the limit of 67108864 (64.0 MiB)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newUpgradeNode(t)
			tc.setup(n)
			log, _ := testLogger()
			_, err := New([]string{n.partition}, WithLogger(log), WithReleaseState(n.state, n.store))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestReleaseManifestOverLimit: a release names its manifests by digest
// only (no size), so a store manifest grown past the limit is refused by
// its size, said as such, not as a digest mismatch; the other images are
// served.
func TestReleaseManifestOverLimit(t *testing.T) {
	n := newUpgradeNode(t)
	p := filepath.Join(n.store, "blobs", "sha256", must(n.tool.Digest()).Hex)
	appendTo(p, strings.Repeat(" ", maxManifestSize))
	addr, logs := n.serve(t)
	if !strings.Contains(logs.String(), p+" is over the limit of 4194304 bytes (4.0 MiB) for a manifest") {
		t.Errorf("start log does not say the manifest is over the limit:\n%s", logs)
	}
	if resp, _ := get(t, "HEAD", "http://"+addr+"/v2/quay.io/acme/tool/manifests/1.1", nil); resp.StatusCode != 404 {
		t.Errorf("tool:1.1: %d, want 404", resp.StatusCode)
	}
	if resp, _ := get(t, "HEAD", "http://"+addr+"/v2/quay.io/acme/app/manifests/1.1", nil); resp.StatusCode != 200 {
		t.Errorf("app:1.1: %d, want 200", resp.StatusCode)
	}
}
