package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// clientEnv isolates skopeo/podman from the host's containers config.
func clientEnv(t *testing.T, registriesConf string) []string {
	t.Helper()
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"default":[{"type":"insecureAcceptAnything"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(conf, []byte(registriesConf), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "containers.conf")
	os.WriteFile(empty, nil, 0o644)
	os.WriteFile(filepath.Join(dir, "auth.json"), []byte("{}"), 0o600)
	return append(os.Environ(), "CONTAINERS_REGISTRIES_CONF="+conf, "CONTAINERS_CONF="+empty, "POLICY="+policy,
		"HOME="+dir, "XDG_CONFIG_HOME="+dir, "REGISTRY_AUTH_FILE="+filepath.Join(dir, "auth.json"))
}

func run(t *testing.T, env []string, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr)
	}
	return out
}

// checkDirCopy checks a `skopeo copy … dir:DIR`: DIR/manifest.json hashes
// to want (dir: keeps manifests byte for byte), and every blob file
// (named by its hex digest) hashes to its name.
func checkDirCopy(t *testing.T, dir string, want v1.Hash) {
	t.Helper()
	mf := must(os.Open(filepath.Join(dir, "manifest.json")))
	got, _, err := v1.SHA256(mf)
	mf.Close()
	if err != nil || (want != v1.Hash{} && got != want) {
		t.Errorf("copied manifest digest %s, want %s (%v)", got, want, err)
	}
	ents := must(os.ReadDir(dir))
	blobs := 0
	for _, e := range ents {
		hexName := strings.TrimSuffix(e.Name(), ".manifest.json")
		if len(hexName) != 64 {
			continue
		}
		f := must(os.Open(filepath.Join(dir, e.Name())))
		h, _, err := v1.SHA256(f)
		f.Close()
		if err != nil || h.Hex != hexName {
			t.Errorf("copied file %s hashes to %s", e.Name(), h)
		}
		blobs++
	}
	if blobs < 2 {
		t.Errorf("%s: only %d blob files copied", dir, blobs)
	}
}

func TestSkopeo(t *testing.T) {
	f := newFixture(t)
	log, _ := testLogger()
	addr := serve(t, must(New([]string{f.dir}, WithLogger(log))))
	env := clientEnv(t, "")
	policy := strings.TrimPrefix(env[len(env)-4], "POLICY=")
	src := "docker://" + addr + "/quay.io/acme/app"

	raw := run(t, env, "skopeo", "inspect", "--tls-verify=false", "--raw", src+":1.2")
	if string(raw) != string(must(f.app.RawManifest())) {
		t.Errorf("skopeo inspect --raw: manifest bytes differ")
	}
	var info struct {
		Digest       string
		Architecture string
		RepoTags     []string
	}
	if err := json.Unmarshal(run(t, env, "skopeo", "inspect", "--tls-verify=false", src+":1.2"), &info); err != nil {
		t.Fatal(err)
	}
	if info.Digest != f.appDigest.String() || info.Architecture != "amd64" || strings.Join(info.RepoTags, ",") != "1.2,latest" {
		t.Errorf("skopeo inspect = %+v, want digest %s, amd64, tags 1.2,latest", info, f.appDigest)
	}

	for _, tc := range []struct{ name, ref, args string }{
		{"by tag", src + ":1.2", ""},
		{"by digest", src + "@" + f.appDigest.String(), ""},
		{"index by tag", "docker://" + addr + "/quay.io/acme/multi:1.0", "--all"},
		{"docker hub name", "docker://" + addr + "/docker.io/library/busybox:1.36", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "dir")
			args := []string{"copy", "--policy", policy, "--src-tls-verify=false"}
			if tc.args != "" {
				args = append(args, tc.args)
			}
			run(t, env, "skopeo", append(args, tc.ref, "dir:"+dest)...)
			if tc.name != "index by tag" {
				checkDirCopy(t, dest, map[string]v1.Hash{"by tag": f.appDigest, "by digest": f.appDigest,
					"docker hub name": must(f.busy.Digest())}[tc.name])
				return
			}
			// skopeo 1.9 re-serialises an index it copies (it drops the
			// descriptors' artifactType), so check the served bytes with
			// inspect --raw and the copy by its children.
			if raw := run(t, env, "skopeo", "inspect", "--tls-verify=false", "--raw", tc.ref); string(raw) != string(must(f.multi.RawManifest())) {
				t.Errorf("skopeo inspect --raw of the index: bytes differ")
			}
			for _, m := range must(f.multi.IndexManifest()).Manifests {
				if _, err := os.Stat(filepath.Join(dest, m.Digest.Hex+".manifest.json")); err != nil {
					t.Errorf("index child %s not copied: %v", m.Digest, err)
				}
			}
			checkDirCopy(t, dest, v1.Hash{})
		})
	}
}

func TestPodmanPull(t *testing.T) {
	f := newFixture(t)
	log, _ := testLogger()
	addr := serve(t, must(New([]string{f.dir}, WithLogger(log))))
	// quay.io itself is unreachable here (no internet; and it is never tried
	// when the mirror answers): the pull can only succeed through kiln serve.
	env := clientEnv(t, fmt.Sprintf(`unqualified-search-registries = []
[[registry]]
prefix = "quay.io"
location = "quay.io"
[[registry.mirror]]
location = "%s/quay.io"
insecure = true
[[registry]]
prefix = "docker.io"
location = "docker.io"
[[registry.mirror]]
location = "%s/docker.io"
insecure = true
`, addr, addr))
	policy := strings.TrimPrefix(env[len(env)-4], "POLICY=")
	store := t.TempDir()
	podman := func(args ...string) []byte {
		return run(t, env, "podman", append([]string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"),
			"--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "none"}, args...)...)
	}
	t.Cleanup(func() { podman("rmi", "-a", "-f") })
	podman("pull", "--signature-policy", policy, "quay.io/acme/app:1.2")
	if got := strings.TrimSpace(string(podman("image", "inspect", "--format", "{{.Digest}}", "quay.io/acme/app:1.2"))); got != f.appDigest.String() {
		t.Errorf("podman pulled digest %s, want %s", got, f.appDigest)
	}
	// Docker Hub short names: podman asks the mirror for docker.io/library/busybox.
	podman("pull", "--signature-policy", policy, "docker.io/busybox:1.36")
	if got := strings.TrimSpace(string(podman("image", "inspect", "--format", "{{.Digest}}", "docker.io/library/busybox:1.36"))); got != must(f.busy.Digest()).String() {
		t.Errorf("podman pulled busybox digest %s, want %s", got, must(f.busy.Digest()))
	}
	podman("pull", "--signature-policy", policy, "--arch", "arm64", "quay.io/acme/multi:1.0")
	if got := strings.TrimSpace(string(podman("image", "inspect", "--format", "{{.Architecture}} {{.Digest}}", "quay.io/acme/multi:1.0"))); got != "arm64 "+f.multiDigest.String() {
		t.Errorf("podman pulled multi-arch image as %q, want arm64 %s", got, f.multiDigest)
	}
}

func TestGGCRRemote(t *testing.T) {
	f := newFixture(t)
	log, _ := testLogger()
	addr := serve(t, must(New([]string{f.dir}, WithLogger(log))))
	ctx := context.Background()
	ref := func(s string) name.Reference { return must(name.ParseReference(addr+"/"+s, name.Insecure)) }

	img, err := remote.Image(ref("quay.io/acme/app:1.2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil { // fetches and hashes every blob
		t.Errorf("remote.Image does not validate: %v", err)
	}
	if d := must(img.Digest()); d != f.appDigest {
		t.Errorf("remote.Image digest %s, want %s", d, f.appDigest)
	}
	desc, err := remote.Get(ref("quay.io/acme/multi:1.0"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Errorf("remote index does not validate: %v", err)
	}
	head, err := remote.Head(ref("quay.io/acme/multi:1.0"))
	if err != nil || head.Digest != f.multiDigest || head.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Errorf("remote.Head = %+v, %v", head, err)
	}
	tags, err := remote.List(ref("quay.io/acme/app:1.2").Context(), remote.WithPageSize(1))
	if err != nil || strings.Join(tags, ",") != "1.2,latest" {
		t.Errorf("remote.List (page size 1) = %v, %v", tags, err)
	}
	reg := must(name.NewRegistry(addr, name.Insecure))
	repos, err := remote.CatalogPage(reg, "", 100)
	if err != nil || strings.Join(repos, ",") != "docker.io/library/busybox,quay.io/acme/app,quay.io/acme/multi,quay.io/acme/pinned" {
		t.Errorf("remote.CatalogPage = %v, %v", repos, err)
	}
	all, err := remote.Catalog(ctx, reg)
	if err != nil || len(all) != 4 {
		t.Errorf("remote.Catalog = %v, %v", all, err)
	}
	subject := must(name.NewDigest(addr+"/quay.io/acme/app@"+f.appDigest.String(), name.Insecure))
	refs, err := remote.Referrers(subject)
	if err != nil {
		t.Fatal(err)
	}
	if m := must(refs.IndexManifest()); len(m.Manifests) != 2 {
		t.Errorf("remote.Referrers: %d manifests, want 2", len(m.Manifests))
	}
	refs, err = remote.Referrers(subject, remote.WithFilter("artifactType", sbomType))
	if err != nil {
		t.Fatal(err)
	}
	if m := must(refs.IndexManifest()); len(m.Manifests) != 1 || m.Manifests[0].Digest != f.sbomDigest {
		t.Errorf("remote.Referrers(artifactType=sbom) = %+v", m.Manifests)
	}
	if _, err := remote.Image(ref("quay.io/acme/app:nope")); err == nil || !strings.Contains(err.Error(), codeManifestUnknown) {
		t.Errorf("remote.Image of a missing tag: %v, want MANIFEST_UNKNOWN", err)
	}
	if err := remote.Write(ref("quay.io/acme/app:pushed"), f.pinned); err == nil || !strings.Contains(err.Error(), codeUnsupported) {
		t.Errorf("remote.Write: %v, want UNSUPPORTED", err)
	}
}
