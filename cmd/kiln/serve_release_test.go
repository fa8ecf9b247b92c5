//go:build !nodeonly

package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// TestServeRelease is the upgrade boot's registry on a node tree: a 1.0
// factory disk, a 1.1 delta bundle whose app:1.1 is served only (not
// preloaded), imported and begun; then `kiln serve --state` (as
// kiln-registry.service runs it) serves app:1.1, its manifest, config and
// new layers from the release store and base:1 from the image partition,
// the mirror gate with --state opens on it, and skopeo copies app:1.1 by
// tag and by digest with every byte verified.
func TestServeRelease(t *testing.T) {
	rs := newReleases(t)
	r11, disk10 := rs.disk10Lock11(t)
	b11 := filepath.Join(rs.dir, "upgrade-1.1.kbundle")
	rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key, "--from", disk10, "--format", "file")
	ign, err := bootconfig.Read(disk10)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"serve --listen 127.0.0.1:5050 --state " + contract.StateFile, "mirror-gate --timeout 120s --drop-in " + contract.MirrorDropIn + " --state " + contract.StateFile,
		`"enabled":true,"name":"` + contract.ReleaseRegistryUnit + `"`} {
		if !strings.Contains(string(ign), want) {
			t.Errorf("the factory Ignition config lacks %s", want)
		}
	}

	n := newImportNode(t, disk10, rs.pub)
	addr := freePort(t)
	n.editContents(t, func(c *contract.Contents) { c.Registry.Listen = addr })
	n.mustKiln(t, rs, "agent", "import", b11)
	if out, code := rs.kiln(t, "agent", "release", "trying", "--root", n.root); code != 1 || !strings.Contains(out, "no release is being tried (current: 1.0.0)") {
		t.Errorf("trying with 1.1 staged: exit %d, want 1 (ExecCondition skips):\n%s", code, out)
	}
	n.mustRelease(t, rs, "begin")
	if out, code := rs.kiln(t, "agent", "release", "trying", "--root", n.root); code != 0 || !strings.Contains(out, "release 1.1.0 is being tried (boot 1)") {
		t.Errorf("trying after begin: exit %d, want 0:\n%s", code, out)
	}
	st := n.state(t)
	var app contract.Image
	for _, im := range st.Trying.Images {
		if im.Name == appImage+"1.1" {
			app = im
		}
	}
	if !app.Served || app.Preloaded {
		t.Fatalf("app:1.1 in the state: %+v, want served only", app)
	}
	stored := n.checkStore(t)
	for _, d := range rs.blobsOf(appImage + "1.1") {
		if !stored[d] {
			t.Fatalf("blob %s of app:1.1 is not in the release store", d)
		}
	}

	stateFile := filepath.Join(n.root, contract.StateFile)
	partition := filepath.Join(n.root, contract.MountPoint)
	serve := exec.Command(kilnBin, "serve", "--listen", addr, "--state", stateFile,
		"--release-store", filepath.Join(n.root, contract.ReleaseStore), partition)
	stderr, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { serve.Process.Kill(); serve.Wait() })
	var logs strings.Builder
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
		}
	}()

	// The gate opens only once the release being tried is served.
	dropIn := filepath.Join(t.TempDir(), "50-kiln-mirror.conf")
	out := rs.mustKiln(t, "agent", "mirror-gate", "--timeout", "60s", "--drop-in", dropIn, "--state", stateFile, partition)
	if !strings.Contains(out, "serves all 3 image(s)") {
		t.Errorf("mirror gate: want it to wait for base:1, app:1.0 and app:1.1:\n%s", out)
	}

	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.json")
	os.WriteFile(policy, []byte(`{"default":[{"type":"insecureAcceptAnything"}]}`), 0o644)
	os.WriteFile(filepath.Join(dir, "registries.conf"), nil, 0o644)
	for _, ref := range []string{appImage + "1.1", "quay.io/acme/app@" + app.Digest, baseImage} {
		dest := filepath.Join(t.TempDir(), "copy")
		cmd := exec.Command("skopeo", "copy", "--quiet", "--policy", policy, "--src-tls-verify=false", "docker://"+addr+"/"+ref, "dir:"+dest)
		cmd.Env = append(os.Environ(), "CONTAINERS_REGISTRIES_CONF="+filepath.Join(dir, "registries.conf"), "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("skopeo copy %s: %v\n%s", ref, err, out)
		}
		want := map[string]bool{}
		img := appImage + "1.1"
		if ref == baseImage {
			img = baseImage
		}
		for _, d := range rs.blobsOf(img) {
			want[strings.TrimPrefix(d, "sha256:")] = true
		}
		if got := "sha256:" + sha256File(t, filepath.Join(dest, "manifest.json")); got != rs.images[img].Digest.String() {
			t.Errorf("%s: copied manifest %s, want %s", ref, got, rs.images[img].Digest)
		}
		entries, _ := os.ReadDir(dest)
		for _, e := range entries {
			if len(e.Name()) != 64 {
				continue
			}
			if got := sha256File(t, filepath.Join(dest, e.Name())); got != e.Name() || !want[got] {
				t.Errorf("%s: copied blob %s hashes to %s (one of the image's: %v)", ref, e.Name(), got, want[got])
			}
			delete(want, e.Name())
		}
		delete(want, rs.images[img].Digest.Hex)
		if len(want) != 0 {
			t.Errorf("%s: blobs not copied: %v", ref, want)
		}
	}

	// After the confirm, the registry stops once every image of the release
	// now current is in local storage (kiln-release-wait.service): 1.1's
	// images, not the factory's app:1.0, which nothing pulls any more.
	n.mustRelease(t, rs, "confirm", "1.1.0")
	graph, runRoot := t.TempDir(), t.TempDir()
	wait := []string{"agent", "wait-images", "--root", graph, "--runroot", runRoot, "--storage-driver", "vfs",
		"--interval", "200ms", "--state", stateFile, partition}
	out, code := rs.kiln(t, append(wait, "--timeout", "1s")...)
	if code == 0 || !strings.Contains(out, "2 of 2 image(s) are still not in local storage: "+appImage+"1.1@") ||
		!strings.Contains(out, baseImage+"@") || strings.Contains(out, appImage+"1.0") {
		t.Errorf("wait-images --state on an empty store: exit %d, want it to wait for base:1 and app:1.1:\n%s", code, out)
	}
	for _, ref := range []string{baseImage, appImage + "1.1"} {
		cmd := exec.Command("skopeo", "copy", "--quiet", "--policy", policy, "--src-tls-verify=false", "docker://"+addr+"/"+ref,
			"containers-storage:[vfs@"+graph+"+"+runRoot+"]"+ref)
		cmd.Env = append(os.Environ(), "CONTAINERS_REGISTRIES_CONF="+filepath.Join(dir, "registries.conf"), "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("skopeo copy %s to containers-storage: %v\n%s", ref, err, out)
		}
	}
	if out, code := rs.kiln(t, append(wait, "--timeout", "30s")...); code != 0 || !strings.Contains(out, "all 2 image(s) are in local storage") {
		t.Errorf("wait-images --state with 1.1's images pulled: exit %d:\n%s", code, out)
	}

	serve.Process.Kill()
	<-logDone
	if !strings.Contains(logs.String(), "msg=ready") || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("kiln serve log:\n%s", logs.String())
	}
}
