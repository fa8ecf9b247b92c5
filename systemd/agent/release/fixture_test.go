package release

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// The releases the tests move between. 1.0 is the factory's (its file
// contents on the image partition); the others keep their blobs in the
// release store. 1.1 and 1.2 share a layer and a file; every release shares
// the base image, which is on the partition.
const (
	quadlet = "/etc/containers/systemd/app.container"
	env     = "/etc/kiln/release/app.env"
	only10  = "/etc/kiln/release/factory.conf"
	only13  = "/etc/containers/systemd/extra.container"
)

// testRelease describes a release by content; blobs are sha256 of content.
type testRelease struct {
	version string
	images  map[string][]string // name → blob contents (first is the manifest)
	files   map[string]string   // node path → content
	trust   []string            // names of testKey keys the node trusts once it is current
	factory bool                // content on the image partition, none in the store
}

// testKey is a trusted key named name (deterministic: seeded by the name).
func testKey(t testing.TB, name string) contract.TrustKey {
	seed := sha256.Sum256([]byte("kiln test key " + name))
	pem, err := bundlefmt.EncodePublicKey(ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := bundlefmt.ParsePublicKey(pem)
	k, err := bundlefmt.TrustedKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// trustOf is tr's trust set.
func (tr testRelease) trustOf(t testing.TB) []contract.TrustKey {
	var keys []contract.TrustKey
	for _, name := range tr.trust {
		keys = append(keys, testKey(t, name))
	}
	return keys
}

var testReleases = map[string]testRelease{
	// Keys rotate: 1.1 adds B beside A, 1.2 drops A, 1.3 (broken: its
	// image is never imported in most tests) would trust C alone.
	"1.0.0": {version: "1.0.0", factory: true, trust: []string{"A"},
		images: map[string][]string{"quay.io/acme/app:1.0": {"manifest app 1.0", "layer app 1.0"}, "quay.io/acme/base:1": {"manifest base", "layer base"}},
		files:  map[string]string{quadlet: "[Container]\nImage=quay.io/acme/app:1.0\n", only10: "factory=1\n"}},
	"1.1.0": {version: "1.1.0", trust: []string{"A", "B"},
		images: map[string][]string{"quay.io/acme/app:1.1": {"manifest app 1.1", "layer shared 1.1+1.2", "layer app 1.1"}, "quay.io/acme/base:1": {"manifest base"}},
		files:  map[string]string{quadlet: "[Container]\nImage=quay.io/acme/app:1.1\n", env: "LEVEL=info\n"}},
	"1.2.0": {version: "1.2.0", trust: []string{"B"},
		images: map[string][]string{"quay.io/acme/app:1.2": {"manifest app 1.2", "layer shared 1.1+1.2", "layer app 1.2"}, "quay.io/acme/base:1": {"manifest base"}},
		files:  map[string]string{quadlet: "[Container]\nImage=quay.io/acme/app:1.2\n", env: "LEVEL=info\n"}},
	"1.3.0": {version: "1.3.0", trust: []string{"C"},
		images: map[string][]string{"quay.io/acme/app:1.3": {"manifest app 1.3", "layer app 1.3"}},
		files:  map[string]string{quadlet: "[Container]\nImage=quay.io/acme/app:1.3\n", only13: "[Container]\nImage=quay.io/acme/app:1.3\n"}},
}

func sha(content string) string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(content)))
}

// record is the contract.Release of tr (the factory's records no keys:
// Init finds them in TrustDir, where Ignition wrote them).
func (tr testRelease) record() contract.Release {
	r := contract.Release{Version: tr.version}
	if !tr.factory {
		r.Trust = tr.trustOf(nil)
	}
	blobs := map[string]bool{}
	for _, name := range sortedKeys(tr.images) {
		contents := tr.images[name]
		r.Images = append(r.Images, contract.Image{Name: name, Digest: sha(contents[0])})
		for _, c := range contents {
			if !(tr.factory || name == "quay.io/acme/base:1") {
				blobs[sha(c)] = true
			}
		}
	}
	for _, p := range sortedKeys(tr.files) {
		c := tr.files[p]
		r.Files = append(r.Files, contract.ReleaseFile{Path: p, Mode: 0o644, Size: int64(len(c)), Digest: sha(c)})
		if !tr.factory {
			blobs[sha(c)] = true
		}
	}
	r.Blobs = sortedKeys(blobs)
	return r
}

// importBlobs puts tr's blobs where the import (or the factory) would:
// the store, or the image partition for the factory release.
func (tr testRelease) importBlobs(t testing.TB, root string) {
	t.Helper()
	dir := filepath.Join(root, contract.ReleaseStore, "blobs", "sha256")
	if tr.factory {
		dir = filepath.Join(root, contract.MountPoint, contract.OCIDir, "blobs", "sha256")
	}
	if err := tr.fill(dir, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// fill writes tr's blobs into dir as an import does: each whole or not at
// all (temp file, rename), step called before each.
func (tr testRelease) fill(dir string, step func(string) error) error {
	var all []string
	for _, name := range sortedKeys(tr.images) {
		if tr.factory || name != "quay.io/acme/base:1" {
			all = append(all, tr.images[name]...)
		}
	}
	for _, p := range sortedKeys(tr.files) {
		all = append(all, tr.files[p])
	}
	for _, c := range all {
		if err := step("copy blob " + sha(c)); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, strings.TrimPrefix(sha(c), "sha256:")), []byte(c), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// node is a node's tree under a temp root, with what stands in for CRI-O.
type node struct {
	root string
}

func newNode(t testing.TB) *node {
	n := &node{root: t.TempDir()}
	// The factory release's files and trusted keys, as Ignition writes them.
	for p, content := range testReleases["1.0.0"].files {
		if err := atomicfile.WriteFile(filepath.Join(n.root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range testReleases["1.0.0"].trustOf(t) {
		if err := atomicfile.WriteFile(filepath.Join(n.root, contract.TrustDir, k.FileName()), []byte(k.PublicKey), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := &contract.Contents{SchemaVersion: contract.ContentsVersion, Version: "1.0.0", Images: testReleases["1.0.0"].record().Images}
	if err := os.MkdirAll(filepath.Join(n.root, contract.MountPoint), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := stage.WriteContents(filepath.Join(n.root, contract.MountPoint), c); err != nil {
		t.Fatal(err)
	}
	return n
}

// crioView is what the stand-in CRI-O last loaded (a copy of the pins
// drop-in at the last ApplyPins).
func (n *node) crioView() string { return filepath.Join(n.root, "test-crio-view.conf") }

// removedLog lists the images the stand-in image remover was asked to remove.
func (n *node) removedLog() string { return filepath.Join(n.root, "test-removed-images") }

// machine returns a Machine on n whose pin applier copies the drop-in to
// crioView and whose image remover logs to removedLog.
func (n *node) machine(boot string, extra ...Option) *Machine {
	opts := []Option{
		WithRoot(n.root),
		WithClock(func() time.Time { return time.Unix(1700000000, 0) }),
		WithBootID(func() (string, error) { return boot, nil }),
		WithPinApplier(PinApplierFunc(func(context.Context) error {
			data, err := os.ReadFile(filepath.Join(n.root, contract.PinsDropIn))
			if err != nil {
				return err
			}
			return os.WriteFile(n.crioView(), data, 0o644)
		})),
		WithImageRemover(removerFunc(func(_ context.Context, ims []contract.Image) error {
			f, err := os.OpenFile(n.removedLog(), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			defer f.Close()
			for _, im := range ims {
				fmt.Fprintln(f, im.Name)
			}
			return nil
		})),
	}
	return New(append(opts, extra...)...)
}

type removerFunc func(context.Context, []contract.Image) error

func (f removerFunc) RemoveImages(ctx context.Context, ims []contract.Image) error {
	return f(ctx, ims)
}

// op is one transition as the tests (and the crash helper) name it.
type op struct {
	Action  string // init, import, stage, import+stage, retry, begin, confirm, rollback, abandon, converge
	Version string
	Boot    string
}

func (o op) String() string { return strings.TrimSpace(o.Action + " " + o.Version) }

// run performs o on n with m. A stage first imports the release's blobs.
func (n *node) run(t testing.TB, m *Machine, o op) (*state.State, error) {
	ctx := context.Background()
	switch o.Action {
	case "init": // as kiln agent release begin does it: kiln.json lists no files
		return m.Init(ctx, contract.Release{Version: "1.0.0", Images: testReleases["1.0.0"].record().Images})
	case "import":
		testReleases[o.Version].importBlobs(t, n.root)
		return nil, nil
	case "stage":
		return m.Stage(ctx, testReleases[o.Version].record())
	case "retry": // stage a release that failed before, as a technician asks
		return m.Import(ctx, testReleases[o.Version].record(), nil, RetryFailed())
	case "import+stage":
		tr := testReleases[o.Version]
		return m.Import(ctx, tr.record(), func(_ context.Context, dir string) error {
			return tr.fill(dir, func(s string) error { m.step(s); return nil })
		})
	case "begin":
		return m.Begin(ctx)
	case "confirm":
		return m.Confirm(ctx, o.Version)
	case "rollback":
		return m.Rollback(ctx, o.Version, "health check failed: app.service is not active")
	case "abandon":
		return m.Abandon(ctx, o.Version)
	case "converge":
		return m.Converge(ctx)
	}
	t.Fatalf("unknown op %q", o.Action)
	return nil, nil
}

// mustRun performs ops in order, failing the test on any error.
func (n *node) mustRun(t testing.TB, ops ...op) {
	t.Helper()
	for _, o := range ops {
		if _, err := n.run(t, n.machine(o.Boot), o); err != nil {
			t.Fatalf("%s: %v", o, err)
		}
	}
}

// copyTo copies n's tree to a new node (cp -a: modes and all).
func (n *node) copyTo(t testing.TB) *node {
	t.Helper()
	c := &node{root: t.TempDir()}
	if out, err := exec.Command("cp", "-a", n.root+"/.", c.root).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	return c
}

// snapshot maps every file under the root (but the lock and the test's own
// logs) to its mode and content digest.
func (n *node) snapshot(t testing.TB) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(n.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(n.root, p)
		if "/"+rel == state.Lock || n.root+"/"+rel == n.removedLog() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		snap[rel] = fmt.Sprintf("%v %s", fi.Mode(), sha(string(data)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func diffSnapshots(a, b map[string]string) string {
	var d []string
	for _, k := range sortedKeys(a) {
		if b[k] != a[k] {
			d = append(d, fmt.Sprintf("%s: %q → %q", k, a[k], b[k]))
		}
	}
	for _, k := range sortedKeys(b) {
		if _, ok := a[k]; !ok {
			d = append(d, fmt.Sprintf("%s: only in the second (%s)", k, b[k]))
		}
	}
	return strings.Join(d, "\n")
}

// checkSafe checks what must hold at every instant, even mid-transition:
// the state parses, every image of every kept release is pinned, and every
// blob a kept release lists is in the store, intact. It returns the state.
func (n *node) checkSafe(t testing.TB) *state.State {
	t.Helper()
	s, err := state.Read(filepath.Join(n.root, contract.StateFile))
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	pinned, err := contract.ReadPins(filepath.Join(n.root, contract.PinsDropIn))
	if err != nil {
		t.Fatalf("pins: %v", err)
	}
	// The node trusts one whole set at every instant: the current
	// release's, or the one before it (a confirm's swap not yet done).
	trusted := n.trusted(t)
	if !slices.ContainsFunc(keySets(), func(set []string) bool { return slices.Equal(set, trusted) }) {
		t.Errorf("the node trusts %v: no release's set (%v)", trusted, keySets())
	}
	for _, r := range s.Releases() {
		for _, im := range r.Images {
			refs, _ := contract.PinRefs(im)
			for _, ref := range refs {
				if !slices.Contains(pinned, ref) {
					t.Errorf("release %s keeps %s but %s is not pinned", r.Version, im.Name, ref)
				}
			}
		}
		for _, b := range r.Blobs {
			data, err := os.ReadFile(filepath.Join(n.root, contract.ReleaseStore, "blobs", "sha256", strings.TrimPrefix(b, "sha256:")))
			if err != nil || sha(string(data)) != b {
				t.Errorf("release %s keeps blob %s: missing or damaged (%v)", r.Version, b, err)
			}
		}
	}
	return s
}

// checkConverged checks a node at rest: checkSafe, plus exactly the active
// release's files, exactly the kept releases pinned (and CRI-O told),
// exactly their blobs stored, nothing retired left over.
func (n *node) checkConverged(t testing.TB) *state.State {
	t.Helper()
	s := n.checkSafe(t)
	active := s.Active()
	want := map[string]contract.ReleaseFile{}
	for _, f := range active.Files {
		want[f.Path] = f
	}
	for _, tr := range testReleases {
		for p := range tr.files {
			data, err := os.ReadFile(filepath.Join(n.root, p))
			f, ok := want[p]
			switch {
			case !ok && err == nil:
				t.Errorf("%s is installed but release %s does not own it", p, active.Version)
			case ok && (err != nil || sha(string(data)) != f.Digest):
				t.Errorf("%s: %v %q, want release %s's content", p, err, data, active.Version)
			}
		}
	}
	var images []contract.Image
	kept := map[string]bool{}
	for _, r := range s.Releases() {
		images = append(images, r.Images...)
		for _, b := range r.Blobs {
			kept[b] = true
		}
	}
	wantPins, _ := contract.RenderPins(images)
	gotPins, _ := os.ReadFile(filepath.Join(n.root, contract.PinsDropIn))
	if string(gotPins) != string(wantPins) {
		t.Errorf("pins:\n%s\nwant\n%s", gotPins, wantPins)
	}
	if view, _ := os.ReadFile(n.crioView()); string(view) != string(wantPins) {
		t.Errorf("CRI-O was not told the pins: it has\n%s", view)
	}
	entries, _ := os.ReadDir(filepath.Join(n.root, contract.ReleaseStore, "blobs", "sha256"))
	for _, e := range entries {
		if !kept["sha256:"+e.Name()] {
			t.Errorf("store holds %s, which no kept release lists", e.Name())
		}
	}
	if len(s.Retired) > 0 {
		t.Errorf("retired releases left in the state: %v", s.Retired)
	}
	var wantKeys []string
	for _, k := range s.Current.Trust {
		wantKeys = append(wantKeys, k.FileName())
	}
	slices.Sort(wantKeys)
	if got := n.trusted(t); !slices.Equal(got, wantKeys) {
		t.Errorf("the node trusts %v, current release %s trusts %v", got, s.Current.Version, wantKeys)
	}
	if _, err := os.Stat(filepath.Join(n.root, "etc/kiln/.trust.old")); err == nil {
		t.Errorf("an old trust set is left beside %s", contract.TrustDir)
	}
	return s
}

// trusted lists the key files in the node's TrustDir.
func (n *node) trusted(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(n.root, contract.TrustDir))
	if err != nil {
		t.Fatalf("trusted keys: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// keySets are the trust sets of the test releases, as key file names.
func keySets() [][]string {
	var sets [][]string
	for _, tr := range testReleases {
		var set []string
		for _, k := range tr.trustOf(nil) {
			set = append(set, k.FileName())
		}
		slices.Sort(set)
		sets = append(sets, set)
	}
	return sets
}

// versions summarises a state as "current/previous/staged/trying".
func versions(s *state.State) string {
	v := func(r *contract.Release) string {
		if r == nil {
			return "-"
		}
		return r.Version
	}
	return strings.Join([]string{s.Current.Version, v(s.Previous), v(s.Staged), v(s.Trying)}, "/")
}
