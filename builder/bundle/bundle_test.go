package bundle

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/partitions/sqfswrite"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"github.com/kiln-appliance/kiln/test/kilnbin"
)

// agentBin is the node edition of kiln, built once: a release carries it.
var agentBin string

func TestMain(m *testing.M) { kilnbin.RunWithAgent(m, &agentBin) }

// releases is one appliance's inputs, generated: a base disk, an OCI layout
// of random images, two signing keys, and a recipe per release.
type releases struct {
	dir, cache, layout string
	key, otherKey      string
	pub                ed25519.PublicKey
	keyID              string
}

const (
	baseImage = "quay.io/acme/base:1" // in every release
	appImage  = "quay.io/acme/app:"   // + the release's version
)

func newReleases(t *testing.T) *releases {
	t.Helper()
	dir := t.TempDir()
	rs := &releases{dir: dir, cache: filepath.Join(dir, "cache"), layout: filepath.Join(dir, "oci")}
	if err := basedisk.Write(filepath.Join(dir, "base.raw")); err != nil {
		t.Fatal(err)
	}
	for i, ref := range []string{baseImage, appImage + "0.9", appImage + "1.0", appImage + "1.1"} {
		if _, err := layers.Random(rs.layout, ref, uint64(i+1), 2, 64<<10); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"factory", "other"} {
		priv, pub, err := bundlefmt.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, name+".key"), priv, 0o600)
		os.WriteFile(filepath.Join(dir, name+".pub"), pub, 0o644)
	}
	rs.key, rs.otherKey = filepath.Join(dir, "factory.key"), filepath.Join(dir, "other.key")
	pub, err := os.ReadFile(filepath.Join(dir, "factory.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if rs.pub, err = bundlefmt.ParsePublicKey(pub); err != nil {
		t.Fatal(err)
	}
	if rs.keyID, err = bundlefmt.KeyID(rs.pub); err != nil {
		t.Fatal(err)
	}
	return rs
}

// recipe writes and locks the recipe of release version of appliance name
// (running app:MAJOR.MINOR), trusting trust ("": the factory key).
func (rs *releases) recipe(t *testing.T, name, version, trust string) string {
	t.Helper()
	return rs.recipeOn(t, filepath.Join(rs.dir, "base.raw"), name, version, trust)
}

// recipeOn is recipe on the base image at base.
func (rs *releases) recipeOn(t *testing.T, base, name, version, trust string) string {
	t.Helper()
	d := filepath.Join(rs.dir, name+"-"+version)
	os.MkdirAll(d, 0o755)
	if trust == "" {
		trust = "trust: [" + filepath.Join(rs.dir, "factory.pub") + "]"
	}
	y := fmt.Sprintf(`apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: %s
version: %s
arch: amd64
base:
  path: %s
images:
  - name: %s
    source: oci:%s:%s
  - name: %s%s
    source: oci:%s:%s%s
%s
`, name, version, base, baseImage, rs.layout, baseImage, appImage, version[:3], rs.layout, appImage, version[:3], trust)
	p := filepath.Join(d, "appliance.yaml")
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := recipes.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.EnsureLock(context.Background(), r, builder.LockOptions{}, io.Discard); err != nil {
		t.Fatal(err)
	}
	return p
}

func (rs *releases) options(out string, opts ...func(*Options)) Options {
	o := Options{Output: out, Key: rs.key, Agent: agentBin, CacheDir: rs.cache}
	for _, f := range opts {
		f(&o)
	}
	return o
}

func (rs *releases) write(t *testing.T, recipe, out string, opts ...func(*Options)) *Result {
	t.Helper()
	res, err := Write(context.Background(), recipe, rs.options(out, opts...))
	if err != nil {
		t.Fatalf("bundle %s: %v", recipe, err)
	}
	return res
}

func from(p ...string) func(*Options) { return func(o *Options) { o.From = p } }

func format(f string) func(*Options) { return func(o *Options) { o.Format = f } }

// A full bundle, as a stick image and as a file: Inspect reads what Write
// wrote, Verify accepts it with the signing key only, and refuses it once
// a byte of it changed.
func TestWriteInspectVerify(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", "")
	for _, f := range []string{FormatImage, FormatFile} {
		t.Run(f, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "upgrade")
			res := rs.write(t, r10, out, format(f))
			m := res.Manifest
			if m.Kind != bundlefmt.KindFull || m.Recipe != "acme" || m.Version != "1.0.0" || len(m.AppliesTo) != 0 || !m.AgentOnStick || res.KeyID != rs.keyID {
				t.Fatalf("manifest: kind %s, %s %s, applies to %v, agent on the stick %v, key %s", m.Kind, m.Recipe, m.Version, m.AppliesTo, m.AgentOnStick, res.KeyID)
			}
			if got := imageNames(m); !slices.Equal(got, []string{appImage + "1.0", baseImage}) {
				t.Errorf("images %v", got)
			}
			for _, b := range m.Blobs {
				if !b.OnStick {
					t.Errorf("a full bundle leaves out blob %s", b.Digest)
				}
			}
			fi, err := os.Stat(out)
			if err != nil || fi.Size() != res.Size {
				t.Fatalf("output %v, %v; Write says %d bytes", fi, err, res.Size)
			}

			rep, err := Inspect(out)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Format != f || rep.Size != res.Size || (rep.Layout != nil) != (f == FormatImage) || !slices.Equal(rep.SignedBy, []string{rs.keyID}) || rep.Manifest.Filesystem != m.Filesystem {
				t.Errorf("Inspect: format %s, size %d, layout %v, signed by %v", rep.Format, rep.Size, rep.Layout != nil, rep.SignedBy)
			}
			if rep.Verified != "" {
				t.Errorf("Inspect claims a verified signature: %s", rep.Verified)
			}
			if rep, err := Verify(context.Background(), out, []ed25519.PublicKey{rs.pub}, nil); err != nil || rep.Verified != rs.keyID {
				t.Fatalf("Verify: %v", err)
			}
			if f == FormatImage {
				if v, err := exec.Command("sgdisk", "-v", out).CombinedOutput(); err != nil || !strings.Contains(string(v), "No problems found") {
					t.Errorf("sgdisk -v: %v\n%s", err, v)
				}
			}

			other := otherKey(t, rs)
			if _, err := Verify(context.Background(), out, []ed25519.PublicKey{other}, nil); err == nil || !strings.Contains(err.Error(), "failed verification: signature: ") {
				t.Errorf("Verify with another key: %v", err)
			}
			// A byte of a file in the filesystem changed.
			damaged := filepath.Join(t.TempDir(), "damaged")
			copyFile(t, out, damaged)
			flip(t, damaged, rep.Offset+rep.Header+m.Files[0].Offset+m.Files[0].Size/2)
			_, err = Verify(context.Background(), damaged, []ed25519.PublicKey{rs.pub}, nil)
			if err == nil || !strings.Contains(err.Error(), "the bundle is damaged or was modified: make or copy it again") || !strings.Contains(err.Error(), "(2 problem(s);") ||
				!strings.Contains(err.Error(), m.Files[0].Path+": digest sha256:") || !strings.Contains(err.Error(), m.Files[0].Path+" (bytes ") {
				// Both checks name the file: re-hashed through the
				// filesystem, and at its byte range.
				t.Errorf("Verify of a damaged bundle = %v, want it to name %s twice", err, m.Files[0].Path)
			}
			// A byte appended.
			copyFile(t, out, damaged)
			fd, _ := os.OpenFile(damaged, os.O_APPEND|os.O_WRONLY, 0)
			fd.Write([]byte{0})
			fd.Close()
			if _, err := Verify(context.Background(), damaged, []ed25519.PublicKey{rs.pub}, nil); err == nil || !strings.Contains(err.Error(), "failed verification: layout: ") {
				t.Errorf("Verify of a bundle with a byte appended = %v", err)
			}
		})
	}
}

// A delta from a release leaves out what its nodes hold, and says which
// release it applies to; nothing new is refused as an empty bundle.
func TestDelta(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", "")
	r11 := rs.recipe(t, "acme", "1.1.0", "")
	b10 := filepath.Join(rs.dir, "upgrade-1.0.img")
	full := rs.write(t, r10, b10)
	b11 := filepath.Join(rs.dir, "upgrade-1.1.img")
	m := rs.write(t, r11, b11, from(b10)).Manifest
	if m.Kind != bundlefmt.KindDelta || len(m.AppliesTo) != 1 || m.AppliesTo[0] != (contract.ReleaseID{Version: "1.0.0", LockDigest: full.Manifest.LockDigest}) {
		t.Fatalf("delta: kind %s, applies to %v", m.Kind, m.AppliesTo)
	}
	if m.AgentOnStick {
		t.Error("the delta carries the agent 1.0.0's nodes run already")
	}
	held := map[string]bool{}
	for _, b := range full.Manifest.Blobs {
		held[b.Digest] = true
	}
	var onStick int
	for _, b := range m.Blobs {
		if b.OnStick == held[b.Digest] {
			t.Errorf("blob %s: on the stick %v, held by 1.0.0 %v", b.Digest, b.OnStick, held[b.Digest])
		}
		if b.OnStick {
			onStick++
		}
	}
	if onStick == 0 {
		t.Error("the delta carries no blob of app:1.1")
	}
	if _, err := Verify(context.Background(), b11, []ed25519.PublicKey{rs.pub}, nil); err != nil {
		t.Fatal(err)
	}

	// 1.0.1 runs what 1.0.0 runs: from it, the bundle would carry nothing.
	r101 := rs.recipe(t, "acme", "1.0.1", "")
	out := filepath.Join(rs.dir, "empty.img")
	_, err := Write(context.Background(), r101, rs.options(out, from(b10)))
	if err == nil || !strings.Contains(err.Error(), "the bundle would be empty: acme 1.0.1 has no blob or OS change that 1.0.0 lacks and no release files; nothing to upgrade") {
		t.Fatalf("an empty delta = %v", err)
	}
	noOutput(t, out)
}

// Write refuses bad input before any long work, says what to do, and
// leaves no output.
func TestWriteRefuses(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", "")
	b10 := filepath.Join(rs.dir, "upgrade-1.0.img")
	rs.write(t, r10, b10)
	r11 := rs.recipe(t, "acme", "1.1.0", "")
	untrusting := rs.recipe(t, "lonely", "1.0.0", "# no trust")
	otherApp := rs.recipe(t, "other", "1.1.0", "")
	unlocked := rs.recipe(t, "acme", "1.1.1", "")
	os.Remove(recipes.LockPath(unlocked))
	junk := filepath.Join(rs.dir, "junk.bin")
	os.WriteFile(junk, []byte("neither disk nor bundle"), 0o644)

	for _, tc := range []struct {
		name   string
		recipe string
		opt    func(*Options)
		want   string
	}{
		{"an unknown format", r11, format("zip"), `format "zip": want image or file`},
		{"no key", r11, func(o *Options) { o.Key = "" }, "no signing key: pass --key NAME.key (make one with `kiln key generate NAME`)"},
		{"a public key for a private one", r11, func(o *Options) { o.Key = filepath.Join(rs.dir, "factory.pub") }, "signing key " + filepath.Join(rs.dir, "factory.pub")},
		{"an untrusted key", r11, func(o *Options) { o.Key = rs.otherKey }, "is not in the recipe's trust, so the appliances would refuse the bundle"},
		{"a key 1.0.0's nodes do not trust", r11, func(o *Options) { o.Key = rs.otherKey; o.From = []string{b10} }, "is not trusted by the nodes running 1.0.0 (--from " + b10 + ")"},
		{"a recipe without trust", untrusting, nil, "the recipe has no trust keys, so its appliances would accept no bundle"},
		{"no lock", unlocked, nil, "no lock file " + recipes.LockPath(unlocked) + ": run `kiln lock " + unlocked + "`"},
		{"not newer than --from", r10, from(b10), "recipe version 1.0.0 is not newer than --from " + b10 + " (1.0.0): raise version in " + r10},
		{"--from another appliance", otherApp, from(b10), `--from ` + b10 + ` is recipe "acme", the bundle is for "other": give a release of the same appliance`},
		{"--from something else", r11, from(junk), "--from " + junk + ": not a kiln disk, kiln.json, bundle or lock file"},
		{"--from a missing file", r11, from(filepath.Join(rs.dir, "missing.img")), "missing.img"},
		{"the output is an input", r11, func(o *Options) { o.Output = b10; o.From = []string{b10} }, b10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "upgrade.img")
			o := rs.options(out)
			if tc.opt != nil {
				tc.opt(&o)
			}
			before, _ := os.ReadFile(o.Output)
			_, err := Write(context.Background(), tc.recipe, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write = %v, want an error containing %q", err, tc.want)
			}
			if after, _ := os.ReadFile(o.Output); o.Output == out {
				noOutput(t, out)
			} else if !slices.Equal(before, after) {
				t.Errorf("a refused bundle changed %s", o.Output)
			}
		})
	}
}

func TestInspectRefuses(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, make([]byte, 64<<10), 0o644)
	disk := filepath.Join(dir, "disk.raw")
	if err := basedisk.Write(disk); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{junk, junk + ": "},
		{disk, disk + ": " + bundlefmt.ErrNotBundle.Error()},
		{filepath.Join(dir, "missing"), "missing"},
	} {
		if _, err := Inspect(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Inspect(%s) = %v, want an error containing %q", tc.path, err, tc.want)
		}
		if _, err := Verify(context.Background(), tc.path, nil, nil); err == nil || !strings.Contains(err.Error(), "failed verification: ") {
			t.Errorf("Verify(%s) = %v", tc.path, err)
		}
	}
}

func TestCheckPrior(t *testing.T) {
	r := &recipes.Recipe{Name: "acme", Arch: "amd64", Version: "1.1.0", Path: "appliance.yaml"}
	for _, tc := range []struct {
		name string
		b    priorRelease
		want string
	}{
		{name: "older", b: priorRelease{recipe: "acme", arch: "amd64", release: contract.ReleaseID{Version: "1.0.0"}}},
		{name: "older by semver, not by string", b: priorRelease{recipe: "acme", arch: "amd64", release: contract.ReleaseID{Version: "1.0.10"}}},
		{name: "the same version", b: priorRelease{recipe: "acme", arch: "amd64", release: contract.ReleaseID{Version: "1.1.0"}}, want: "recipe version 1.1.0 is not newer than --from F (1.1.0): raise version in appliance.yaml; nodes refuse a downgrade or a replay"},
		{name: "newer", b: priorRelease{recipe: "acme", arch: "amd64", release: contract.ReleaseID{Version: "1.2.0"}}, want: "is not newer than --from F (1.2.0)"},
		{name: "another appliance", b: priorRelease{recipe: "other", arch: "amd64", release: contract.ReleaseID{Version: "1.0.0"}}, want: `--from F is recipe "other", the bundle is for "acme"`},
		{name: "another arch", b: priorRelease{recipe: "acme", arch: "arm64", release: contract.ReleaseID{Version: "1.0.0"}}, want: "--from F is for arm64, the recipe for amd64"},
		{name: "not a version", b: priorRelease{recipe: "acme", arch: "amd64", release: contract.ReleaseID{Version: "latest"}}, want: "--from F: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.b.from = "F"
			err := checkPrior(r, &tc.b)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("checkPrior = %v, want %q", err, tc.want)
			}
		})
	}
}

// checkSigner: the --from releases that say whom their nodes trust decide;
// the recipe's trust only when none says.
func TestCheckSigner(t *testing.T) {
	key := func() (ed25519.PrivateKey, ed25519.PublicKey) {
		pub, priv, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		return priv, pub
	}
	old, oldPub := key()
	_, newPub := key()
	for _, tc := range []struct {
		name   string
		trust  []ed25519.PublicKey
		priors []*priorRelease
		want   string
	}{
		{name: "in the recipe's trust", trust: []ed25519.PublicKey{newPub, oldPub}},
		{name: "not in the recipe's trust", trust: []ed25519.PublicKey{newPub}, want: "is not in the recipe's trust"},
		{name: "rotation: the base trusts it, the recipe no more", trust: []ed25519.PublicKey{newPub}, priors: []*priorRelease{{from: "1.0", trust: []ed25519.PublicKey{oldPub}}}},
		{name: "a base that does not trust it", trust: []ed25519.PublicKey{oldPub}, priors: []*priorRelease{{from: "1.0", release: contract.ReleaseID{Version: "1.0.0"}, trust: []ed25519.PublicKey{newPub}}},
			want: "is not trusted by the nodes running 1.0.0 (--from 1.0)"},
		{name: "one base of two does not", trust: []ed25519.PublicKey{oldPub}, priors: []*priorRelease{{from: "a", trust: []ed25519.PublicKey{oldPub}}, {from: "b", release: contract.ReleaseID{Version: "0.9.0"}, trust: []ed25519.PublicKey{newPub}}},
			want: "(--from b)"},
		{name: "bases that do not say: the recipe's trust", trust: []ed25519.PublicKey{newPub}, priors: []*priorRelease{{from: "kiln.json"}}, want: "is not in the recipe's trust"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := checkSigner(old, tc.trust, tc.priors)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("checkSigner = %v, want %q", err, tc.want)
				}
				return
			}
			want, _ := bundlefmt.KeyID(oldPub)
			if err != nil || id != want {
				t.Fatalf("checkSigner = %s, %v; want %s", id, err, want)
			}
		})
	}
}

func TestPlaceFiles(t *testing.T) {
	files := []sqfswrite.File{{Path: "a", Offset: 96, Size: 10}, {Path: "b", Offset: 4096, Size: 20}}
	for _, tc := range []struct {
		name   string
		listed []bundlefmt.File
		want   string
	}{
		{name: "the same files", listed: []bundlefmt.File{{Path: "b", Size: 20}, {Path: "a", Size: 10}}},
		{name: "one missing", listed: []bundlefmt.File{{Path: "a", Size: 10}}, want: "kiln bug: the bundle filesystem holds 2 files, the manifest lists 1"},
		{name: "another size", listed: []bundlefmt.File{{Path: "a", Size: 10}, {Path: "b", Size: 21}}, want: "kiln bug: b (21 bytes) is not in the bundle filesystem as listed"},
		{name: "another file", listed: []bundlefmt.File{{Path: "a", Size: 10}, {Path: "c", Size: 20}}, want: "kiln bug: c (20 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &bundlefmt.Manifest{Files: tc.listed}
			err := placeFiles(m, files)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("placeFiles = %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil || m.Files[0].Offset != 4096 || m.Files[1].Offset != 96 {
				t.Fatalf("placeFiles = %v, files %+v", err, m.Files)
			}
		})
	}
}

func imageNames(m *bundlefmt.Manifest) []string {
	var out []string
	for _, im := range m.Images {
		out = append(out, im.Name)
	}
	return out
}

func otherKey(t *testing.T, rs *releases) ed25519.PublicKey {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rs.dir, "other.pub"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := bundlefmt.ParsePublicKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
}

func flip(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	f.ReadAt(b, off)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// noOutput: nothing at out, and nothing of the run beside it.
func noOutput(t *testing.T, out string) {
	t.Helper()
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a refused bundle left %s", out)
	}
	entries, _ := os.ReadDir(filepath.Dir(out))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("a refused bundle left %s beside its output", e.Name())
		}
	}
}

// Every form of --from that names release 1.0.0 (its bundle, its disk, the
// disk's kiln.json, its lock with the recipe beside it) gives the same
// delta: the same release applied to, the same blobs left out, and the
// trust its nodes have checked where the form says it.
func TestDeltaFromEachForm(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", "")
	r11 := rs.recipe(t, "acme", "1.1.0", "")
	b10 := filepath.Join(rs.dir, "upgrade-1.0.img")
	rs.write(t, r10, b10)
	disk := filepath.Join(rs.dir, "disk-1.0.raw")
	if _, err := builder.Build(context.Background(), r10, builder.Options{Output: disk, CacheDir: rs.cache, Agent: agentBin}); err != nil {
		t.Fatal(err)
	}
	fsys, closer, err := squashfs.OpenImagePartition(disk)
	if err != nil {
		t.Fatal(err)
	}
	kj, err := fs.ReadFile(fsys, contract.ContentsFile)
	closer.Close()
	if err != nil {
		t.Fatal(err)
	}
	kilnJSON := filepath.Join(rs.dir, "kiln.json")
	os.WriteFile(kilnJSON, kj, 0o644)

	var want *bundlefmt.Manifest
	for _, f := range []string{b10, disk, kilnJSON, recipes.LockPath(r10)} {
		t.Run(filepath.Base(f), func(t *testing.T) {
			m := rs.write(t, r11, filepath.Join(t.TempDir(), "upgrade.img"), from(f)).Manifest
			if m.Kind != bundlefmt.KindDelta || len(m.AppliesTo) != 1 || m.AppliesTo[0].Version != "1.0.0" {
				t.Fatalf("kind %s, applies to %v", m.Kind, m.AppliesTo)
			}
			if want == nil {
				want = m
				return
			}
			if m.AppliesTo[0] != want.AppliesTo[0] {
				t.Errorf("applies to %v, from the bundle %v", m.AppliesTo[0], want.AppliesTo[0])
			}
			if got, w := onStick(m), onStick(want); !slices.Equal(got, w) {
				t.Errorf("blobs on the stick %v, from the bundle %v", got, w)
			}
		})
	}
	// A disk trusts its factory key: the other key is refused from it too.
	_, err = Write(context.Background(), r11, rs.options(filepath.Join(t.TempDir(), "x.img"), from(disk), func(o *Options) { o.Key = rs.otherKey }))
	if err == nil || !strings.Contains(err.Error(), "is not trusted by the nodes running 1.0.0 (--from "+disk+")") {
		t.Errorf("another key from a disk = %v", err)
	}
}

func onStick(m *bundlefmt.Manifest) []string {
	var out []string
	for _, b := range m.Blobs {
		if b.OnStick {
			out = append(out, b.Digest)
		}
	}
	return out
}
