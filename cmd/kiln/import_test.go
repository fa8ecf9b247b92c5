//go:build !nodeonly

package main

// Tests of kiln agent import on a node tree of its own: bundles made by
// kiln bundle in the test, the stick's partition as a real block device
// (loop, partscan), the factory release's image partition mounted by the
// kernel, and /var as a real tmpfs where space matters.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/agent/bundleimport"
	"github.com/kiln-appliance/kiln/systemd/agent/release"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// importNode is a node's tree: the factory disk's image partition (its
// kiln.json copied, so a test may edit it; its oci linked), trusted keys.
type importNode struct {
	root string
}

func newImportNode(t *testing.T, disk string, trust ...string) *importNode {
	t.Helper()
	n := &importNode{root: t.TempDir()}
	n.setup(t, disk, trust...)
	return n
}

func (n *importNode) setup(t *testing.T, disk string, trust ...string) {
	t.Helper()
	part := mountImagePartition(t, disk)
	img := filepath.Join(n.root, contract.MountPoint)
	if err := os.MkdirAll(img, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(part, contract.ContentsFile))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(img, contract.ContentsFile), data, 0o644)
	if err := os.Symlink(filepath.Join(part, contract.OCIDir), filepath.Join(img, contract.OCIDir)); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.root, contract.TrustDir)
	os.MkdirAll(dir, 0o755)
	for _, p := range trust {
		pem, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, contract.TrustFileName(pem)), pem, 0o644)
	}
}

func (n *importNode) kiln(t *testing.T, rs *releases, args ...string) (string, int) {
	t.Helper()
	flags := []string{"--root", n.root, "--apply-pins", "none"}
	if i := slices.Index(args, "--"); i >= 0 { // flags before a command's own arguments
		return rs.kiln(t, append(append(slices.Clone(args[:i]), flags...), args[i:]...)...)
	}
	return rs.kiln(t, append(args, flags...)...)
}

// snapshot maps every path under the node's root to its content's digest.
func (n *importNode) snapshot(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(n.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(n.root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "-> " + target
		case d.IsDir():
			out[rel] = "dir"
		default:
			data, _ := os.ReadFile(p)
			sum := sha256.Sum256(data)
			out[rel] = hex.EncodeToString(sum[:])
		}
		return nil
	})
	return out
}

func (n *importNode) state(t *testing.T) *state.State {
	t.Helper()
	s, err := state.Read(filepath.Join(n.root, contract.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkStore checks every blob in the release store hashes to its name.
func (n *importNode) checkStore(t *testing.T) map[string]bool {
	t.Helper()
	return n.checkBlobDir(t, filepath.Join(n.root, contract.ReleaseStore, "blobs", "sha256"))
}

// checkBlobDir checks every file in dir hashes to its name and returns
// their digests.
func (n *importNode) checkBlobDir(t *testing.T, dir string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		if got := sha256File(t, filepath.Join(dir, e.Name())); got != e.Name() {
			t.Errorf("stored blob %s hashes to %s", e.Name(), got)
		}
		out["sha256:"+e.Name()] = true
	}
	return out
}

// attachStick attaches a stick image's bundle partition read-only as a
// block device of its own, as the kernel shows a USB stick's partition
// (this machine's loop driver does not scan partition tables).
func attachStick(t *testing.T, img string) string {
	t.Helper()
	layout, err := gpt.Inspect(img)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := layout.Find(bundlefmt.PartitionName)
	if !ok {
		t.Fatalf("%s has no %s partition", img, bundlefmt.PartitionName)
	}
	dev := strings.TrimSpace(run(t, "losetup", "--find", "--show", "--read-only",
		"--offset", fmt.Sprint(p.Offset), "--sizelimit", fmt.Sprint(p.Size), img))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func sortedNames(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestImport(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", releaseFiles+"upgrade:\n  health: {units: [app.service], command: [/usr/bin/curl, -fsS, 'http://127.0.0.1:8080/healthz'], timeout: 90s, unhealthyExitCode: 3}\n")
	r11 := preloadApp(t, rs.recipe(t, "acme", "1.1.0", releaseFiles))
	r12 := preloadApp(t, rs.recipe(t, "acme", "1.2.0", releaseFiles))
	other := rs.recipe(t, "other", "1.1.0", "")
	disk10 := filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10)
	for _, r := range []string{r11, r12, other} {
		rs.mustKiln(t, "lock", r)
	}
	b11 := filepath.Join(rs.dir, "upgrade-1.1.img")      // delta from 1.0, a stick
	b12 := filepath.Join(rs.dir, "upgrade-1.2.kbundle")  // full, a file
	d12 := filepath.Join(rs.dir, "delta-1.2-on-1.1.img") // delta from 1.1
	bOther := filepath.Join(rs.dir, "other-1.1.kbundle")
	rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key, "--from", disk10)
	rs.mustKiln(t, "bundle", r12, "-o", b12, "--key", rs.key, "--format", "file")
	rs.mustKiln(t, "bundle", r12, "-o", d12, "--key", rs.key, "--from", b11)
	rs.mustKiln(t, "bundle", other, "-o", bOther, "--key", rs.key, "--format", "file")
	// The factory disk carries the import's udev rule and units, with the
	// default reboot policy (a one-minute countdown).
	ign, err := bootconfig.Read(disk10)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{contract.BundleUdevRule, `"name":"` + contract.ImportUnit + `"`, `"enabled":true,"name":"` + contract.ReleaseBeginUnit + `"`, "shutdown --reboot +1 ",
		`agent release check --timeout 90s --unit \"app.service\" --unhealthy-exit-code 3 -- \"/usr/bin/curl\" \"-fsS\" \"http://127.0.0.1:8080/healthz\"`} {
		if !strings.Contains(string(ign), want) {
			t.Errorf("the factory Ignition config lacks %s", want)
		}
	}
	stick11 := attachStick(t, b11)
	stickD12 := attachStick(t, d12)

	t.Run("a delta stick is staged with its blobs and images", func(t *testing.T) {
		n := newImportNode(t, disk10, rs.pub)
		out, code := n.kiln(t, rs, "agent", "import", stick11)
		t.Logf("%s", out)
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		// The pins line counts images, each once (base:1 is in both releases).
		for _, want := range []string{"signed by SHA256:", "copy 5 blob(s) for 2 image(s): done, 605.1 KiB in ", "release 1.1.0 is staged; the stick may be removed now",
			"pins: 3 image(s) pinned in " + contract.PinsDropIn} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
		s := n.state(t)
		if s.Staged == nil || s.Staged.Version != "1.1.0" || s.Current.Version != "1.0.0" {
			t.Fatalf("state: %+v", s)
		}
		stored := n.checkStore(t)
		want := map[string]bool{}
		for _, b := range s.Staged.Blobs {
			want[b] = true
		}
		if got, w := sortedNames(stored), sortedNames(want); strings.Join(got, " ") != strings.Join(w, " ") {
			t.Errorf("release store holds %v, the staged release keeps %v", got, w)
		}
		// The delta's app:1.1 layers are new; base:1 is on the image partition.
		for _, d := range rs.blobsOf(baseImage) {
			if stored[d] {
				t.Errorf("blob %s of %s is on the image partition and was copied too", d, baseImage)
			}
		}
		for _, d := range rs.blobsOf(appImage + "1.1") {
			if !stored[d] {
				t.Errorf("blob %s of app:1.1 is not stored", d)
			}
		}

		// Its preloaded images are in the node's containers/storage, found
		// by manifest digest as CRI-O finds them, their layers readable.
		n.checkImages(t, s.Staged)

		// A second stick while one release is staged.
		before := n.snapshot(t)
		out, code = n.kiln(t, rs, "agent", "import", b12)
		if code == 0 || !strings.Contains(out, "release 1.1.0 is staged and not yet tried; reboot the appliance to try it (or drop it: kiln agent release abandon 1.1.0), then import 1.2.0") || !strings.Contains(out, "nothing was changed") {
			t.Errorf("second stick: exit %d:\n%s", code, out)
		}
		if d := diffSnapshot(before, n.snapshot(t)); d != "" {
			t.Errorf("a refused import changed the node:\n%s", d)
		}
		// The same stick again (a technician plugs it twice): nothing to do,
		// and the console says so, not that another release is staged.
		out, code = n.kiln(t, rs, "agent", "import", stick11)
		if code != 0 || !strings.Contains(out, "release 1.1.0 was imported before and waits for its upgrade boot; reboot the appliance to try it; nothing was changed") ||
			!strings.Contains(out, "release 1.1.0 is staged; the stick may be removed now") {
			t.Errorf("the staged stick again: exit %d:\n%s", code, out)
		}
		if d := diffSnapshot(before, n.snapshot(t)); d != "" {
			t.Errorf("importing the staged release again changed the node:\n%s", d)
		}

		// Tried and confirmed, 1.1 is current; 1.2's delta on 1.1 applies.
		n.mustRelease(t, rs, "begin")
		n.mustRelease(t, rs, "confirm", "1.1.0")
		out, code = n.kiln(t, rs, "agent", "import", stickD12)
		if code != 0 || n.state(t).Staged == nil || n.state(t).Staged.Version != "1.2.0" {
			t.Fatalf("delta 1.2 on 1.1: exit %d:\n%s", code, out)
		}
		n.checkStore(t)
	})

	t.Run("the health check rolls a failing release back and confirms a healthy one", func(t *testing.T) {
		n := newImportNode(t, disk10, rs.pub)
		out := n.mustKiln(t, rs, "agent", "release", "check", "--timeout", "1s", "--", "false")
		if !strings.Contains(out, "health check: no release is being tried; nothing to do") {
			t.Errorf("check with nothing tried:\n%s", out)
		}
		n.mustKiln(t, rs, "agent", "import", b12)
		n.mustRelease(t, rs, "begin")
		out, code := n.kiln(t, rs, "agent", "release", "check", "--timeout", "1s", "--", "sh", "-c", "echo app not ready; exit 1")
		if !strings.Contains(out, `health check of release 1.2.0: "sh -c echo app not ready; exit 1" exits 0, within 1s`) {
			t.Errorf("the check does not say what it waits for:\n%s", out)
		}
		if code != 1 || !strings.Contains(out, "release 1.2.0 failed its health check: after 1s command sh -c echo app not ready; exit 1 failed (exit status 1): app not ready; rolled back to 1.0.0") {
			t.Errorf("failing check: exit %d:\n%s", code, out)
		}
		if s := n.state(t); s.Current.Version != "1.0.0" || s.Trying != nil || s.Last == nil || s.Last.OK {
			t.Errorf("after the failed check: %+v", s)
		}
		// The same stick again (plugged in, or left in at boot): refused,
		// saying when and why it failed and how to retry it; nothing changed.
		before := n.snapshot(t)
		out, code = n.kiln(t, rs, "agent", "import", b12)
		for _, want := range []string{"bundle " + b12 + " refused: release 1.2.0 failed on this node before: rolled back on ",
			" UTC: health check: after 1s command sh -c echo app not ready; exit 1 failed (exit status 1): app not ready; ",
			"send this line to the factory and ask for a fixed release; to try 1.2.0 once more anyway, run: " + contract.AgentPath + " agent import --retry-failed " + b12 + "; nothing was changed"} {
			if code != 1 || !strings.Contains(out, want) {
				t.Errorf("the failed release again: exit %d, want %q in:\n%s", code, want, out)
			}
		}
		if d := diffSnapshot(before, n.snapshot(t)); d != "" {
			t.Errorf("the refused import changed the node:\n%s", d)
		}
		// Retried by hand: staged, said loudly, and the failure stays in
		// the status until a release is confirmed.
		out = n.mustKiln(t, rs, "agent", "import", "--retry-failed", b12)
		for _, want := range []string{"kiln: RETRYING release 1.2.0, which failed on this node before, as asked (--retry-failed): release 1.2.0 failed on this node before: rolled back on ",
			"release 1.2.0 is staged again; the stick may be removed now; reboot the appliance (systemctl reboot) to try it once more"} {
			if !strings.Contains(out, want) {
				t.Errorf("the retry: want %q in:\n%s", want, out)
			}
		}
		status := rs.mustKiln(t, "agent", "status", "--root", n.root)
		if !regexp.MustCompile(`(?m)^last: +stage 1\.2\.0 ok `).MatchString(status) ||
			!regexp.MustCompile(`(?m)^failed: +1\.2\.0 rolled back at \S+Z: health check: after 1s command sh -c echo app not ready; exit 1 failed \(exit status 1\): app not ready$`).MatchString(status) {
			t.Errorf("status after the retry:\n%s", status)
		}
		n.mustRelease(t, rs, "begin")
		out = n.mustKiln(t, rs, "agent", "release", "check", "--timeout", "10s", "--", "true")
		if !strings.Contains(out, `health check of release 1.2.0: "true" exits 0, within 10s`) {
			t.Errorf("the check does not say what it waits for:\n%s", out)
		}
		if !strings.Contains(out, "release 1.2.0 passed its health check and is now current") {
			t.Errorf("passing check:\n%s", out)
		}
		if s := n.state(t); s.Current.Version != "1.2.0" || s.Previous == nil || s.Previous.Version != "1.0.0" || s.Failed != nil {
			t.Errorf("after the passed check: %+v", s)
		}
		if status := rs.mustKiln(t, "agent", "status", "--root", n.root); strings.Contains(status, "failed:") {
			t.Errorf("status after the confirm still shows a failure:\n%s", status)
		}
	})

	// The command's unhealthy exit code rolls back at once, not at the
	// timeout, and the reason says the verdict was final.
	t.Run("the unhealthy exit code rolls back at once", func(t *testing.T) {
		n := newImportNode(t, disk10, rs.pub)
		out, code := n.kiln(t, rs, "agent", "release", "check", "--timeout", "1m", "--unhealthy-exit-code", "3")
		if code != 2 || !strings.Contains(out, "--unhealthy-exit-code 3: want an exit status from 1 to 255, with a COMMAND") {
			t.Errorf("a code without a command: exit %d:\n%s", code, out)
		}
		n.mustKiln(t, rs, "agent", "import", b12)
		n.mustRelease(t, rs, "begin")
		start := time.Now()
		out, code = n.kiln(t, rs, "agent", "release", "check", "--timeout", "1m", "--unhealthy-exit-code", "3", "--", "sh", "-c", "echo config invalid; exit 3")
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("the check took %s of its 1m timeout: it did not stop at the unhealthy code", took)
		}
		if !strings.Contains(out, `health check of release 1.2.0: "sh -c echo config invalid; exit 3" exits 0 (exit 3: unhealthy for good, roll back at once), within 1m0s`) {
			t.Errorf("the check does not say what it waits for:\n%s", out)
		}
		const reason = "health check: command sh -c echo config invalid; exit 3 said unhealthy (exit status 3): config invalid"
		if code != 1 || !strings.Contains(out, "release 1.2.0 failed its "+reason+"; rolled back to 1.0.0") {
			t.Errorf("unhealthy check: exit %d:\n%s", code, out)
		}
		if s := n.state(t); s.Current.Version != "1.0.0" || s.Trying != nil || len(s.Failed) == 0 || !strings.Contains(rs.mustKiln(t, "agent", "status", "--root", n.root), reason) {
			t.Errorf("after the unhealthy check: %+v", s)
		}
	})

	// One byte inside a blob the import copies, and one in the filesystem's
	// metadata at its end, which the import never reads (it mounts nothing).
	var rep struct {
		Offset   int64               `json:"offset"`
		Header   int64               `json:"headerSize"`
		Manifest *bundlefmt.Manifest `json:"manifest"`
	}
	if err := json.Unmarshal([]byte(rs.mustKiln(t, "inspect", "-o", "json", b12)), &rep); err != nil {
		t.Fatal(err)
	}
	tampered, tamperedMeta := filepath.Join(rs.dir, "tampered.kbundle"), filepath.Join(rs.dir, "tampered-metadata.kbundle")
	copyFile(t, b12, tampered)
	copyFile(t, b12, tamperedMeta)
	for _, f := range rep.Manifest.Files {
		if strings.HasPrefix(f.Path, bundlefmt.OCIDir+"/blobs/") && f.Size > 0 {
			flipByte(t, tampered, rep.Offset+rep.Header+f.Offset+f.Size/2)
			break
		}
	}
	flipByte(t, tamperedMeta, -100) // in the filesystem's last chunk
	badSig := filepath.Join(rs.dir, "bad-signature.kbundle")
	copyFile(t, b12, badSig)
	flipSignedByte(t, badSig)

	// Each refusal on a fresh 1.0 node, or one moved to 1.2.
	for _, c := range []struct {
		name   string
		source string
		node   func(t *testing.T, n *importNode)
		want   string
	}{
		{"tampered blob", tampered, nil, "bundle is damaged: blob sha256:"},
		{"tampered manifest", badSig, nil, "bundle is damaged: the signature of SHA256:"},
		{"untrusted key", b12, func(t *testing.T, n *importNode) {
			os.RemoveAll(filepath.Join(n.root, contract.TrustDir))
			n.setupTrust(t, rs.otherPub)
		}, "not signed by a trusted key (signed by [SHA256:"},
		{"no trusted key at all", b12, func(t *testing.T, n *importNode) {
			os.RemoveAll(filepath.Join(n.root, contract.TrustDir))
		}, "this node trusts no bundle key"},
		{"another recipe", bOther, nil, "bundle is for another appliance: it is other for amd64, this node runs acme for amd64"},
		{"another arch", b12, func(t *testing.T, n *importNode) {
			n.editContents(t, func(c *contract.Contents) { c.Arch = "arm64" })
		}, "this node runs acme for arm64"},
		{"a delta for another base", stickD12, nil, "delta bundle does not apply to the running release: it applies to 1.1.0, this node runs 1.0.0"},
		{"same version", b12, func(t *testing.T, n *importNode) {
			n.mustKiln(t, rs, "agent", "import", b12)
			n.mustRelease(t, rs, "begin")
			n.mustRelease(t, rs, "confirm", "1.2.0")
		}, "bundle 1.2.0 is the same as the running 1.2.0"},
		{"downgrade", stick11, func(t *testing.T, n *importNode) {
			n.mustKiln(t, rs, "agent", "import", b12)
			n.mustRelease(t, rs, "begin")
			n.mustRelease(t, rs, "confirm", "1.2.0")
		}, "bundle 1.1.0 is older than the running 1.2.0"},
		{"no space on /var", b12, nil, "not enough free space on /var: the import needs"},
		{"not a bundle", rs.pub, nil, "not a kiln bundle"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := &importNode{root: t.TempDir()}
			if c.name == "no space on /var" {
				n.smallVar(t, "64k")
			}
			n.setup(t, disk10, rs.pub)
			if c.node != nil {
				c.node(t, n)
			}
			before := n.snapshot(t)
			out, code := n.kiln(t, rs, "agent", "import", c.source)
			t.Logf("%s", out)
			if code == 0 || !strings.Contains(out, c.want) {
				t.Errorf("exit %d, want failure saying %q", code, c.want)
			}
			if d := diffSnapshot(before, n.snapshot(t)); d != "" {
				t.Errorf("a refused import changed the node:\n%s", d)
			}
		})
	}

	t.Run("a byte changed where the import reads nothing does not matter", func(t *testing.T) {
		n := newImportNode(t, disk10, rs.pub)
		if out, code := n.kiln(t, rs, "agent", "import", tamperedMeta); code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if s := n.state(t); s.Staged == nil || s.Staged.Version != "1.2.0" {
			t.Errorf("state: %+v", s)
		}
		n.checkStore(t)
	})

	t.Run("a stopped import (the unit stopped: SIGTERM) stages nothing", func(t *testing.T) {
		n := newImportNode(t, disk10, rs.pub)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_, err := bundleimport.Import(ctx, b12, bundleimport.WithRoot(n.root), bundleimport.WithLog(io.Discard),
			bundleimport.WithMachine(release.New(release.WithRoot(n.root), release.WithPinApplier(noPins))),
			bundleimport.WithCopyHook(func(string) { cancel() }))
		if err == nil || !strings.Contains(err.Error(), "context canceled") {
			t.Fatalf("stopped import: %v", err)
		}
		if _, err := os.Stat(filepath.Join(n.root, contract.StateFile)); err == nil {
			if s := n.state(t); s.Staged != nil {
				t.Errorf("a stopped import staged %s", s.Staged.Version)
			}
		}
		for _, dir := range []string{"blobs/sha256", "incoming"} {
			if tmps, _ := filepath.Glob(filepath.Join(n.root, contract.ReleaseStore, dir, ".*")); len(tmps) > 0 {
				t.Errorf("temp files left in the store: %v", tmps)
			}
		}
	})

	t.Run("the stick pulled mid-import fails cleanly and plugged again resumes", func(t *testing.T) {
		n := newImportNode(t, disk10, rs.pub)
		stick := filepath.Join(t.TempDir(), "stick.kbundle")
		copyFile(t, b12, stick)
		var copied []string
		pulled := false
		var log bytes.Buffer
		_, err := bundleimport.Import(context.Background(), stick, bundleimport.WithRoot(n.root), bundleimport.WithLog(&log),
			bundleimport.WithMachine(release.New(release.WithRoot(n.root), release.WithPinApplier(noPins))),
			bundleimport.WithCopyHook(func(d string) {
				copied = append(copied, d)
				if len(copied) == 3 && !pulled { // two blobs are in; the stick goes
					pulled = true
					if err := os.Truncate(stick, 8192); err != nil {
						t.Fatal(err)
					}
				}
			}))
		t.Logf("%s", log.String())
		if err == nil || !strings.Contains(err.Error(), "nothing was staged, plug the stick in again") {
			t.Fatalf("pulled stick: %v", err)
		}
		if _, err := os.Stat(filepath.Join(n.root, contract.StateFile)); err == nil {
			if s := n.state(t); s.Staged != nil {
				t.Fatalf("a pulled stick staged %s", s.Staged.Version)
			}
		}
		// Kept verified beside the store, where its collection leaves them.
		kept := n.checkBlobDir(t, filepath.Join(n.root, contract.ReleaseStore, "incoming"))
		if len(kept) != 2 {
			t.Errorf("%d blobs kept after the pull, want the 2 copied before it: %v", len(kept), sortedNames(kept))
		}

		copyFile(t, b12, stick) // plugged in again
		copied = nil
		log.Reset()
		if _, err := bundleimport.Import(context.Background(), stick, bundleimport.WithRoot(n.root), bundleimport.WithLog(&log),
			bundleimport.WithMachine(release.New(release.WithRoot(n.root), release.WithPinApplier(noPins))),
			bundleimport.WithCopyHook(func(d string) { copied = append(copied, d) })); err != nil {
			t.Fatalf("re-plugged: %v\n%s", err, log.String())
		}
		for _, d := range copied {
			if kept[d] {
				t.Errorf("blob %s was copied again; the re-run should resume", d)
			}
		}
		if s := n.state(t); s.Staged == nil || s.Staged.Version != "1.2.0" {
			t.Errorf("state after the resumed import: %+v", s)
		}
		n.checkStore(t)
	})
}

func (n *importNode) checkImages(t *testing.T, r *contract.Release) {
	t.Helper()
	f := releaseFlags{root: n.root}
	store, err := f.openStore()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Shutdown(true)
	preloaded := 0
	for _, im := range r.Images {
		if !im.Preloaded {
			continue
		}
		preloaded++
		found, err := store.ImagesByDigest(digest.Digest(im.Digest))
		if err != nil || len(found) != 1 {
			t.Errorf("%s (%s) in containers/storage: %v, %v", im.Name, im.Digest, found, err)
			continue
		}
		if got := "sha256:" + found[0].ID; got != im.ImageID {
			t.Errorf("%s: image ID %s, want %s", im.Name, got, im.ImageID)
		}
		for l := found[0].TopLayer; l != ""; {
			layer, err := store.Layer(l)
			if err != nil {
				t.Fatal(err)
			}
			rc, err := store.Diff("", l, nil)
			if err != nil {
				t.Fatalf("%s layer %s: %v", im.Name, l, err)
			}
			rc.Close()
			l = layer.Parent
		}
	}
	if preloaded == 0 {
		t.Errorf("release %s preloads no image: the test proves nothing", r.Version)
	}
	store.Shutdown(true)
	want := map[string]contract.Image{}
	for _, im := range r.Images {
		if im.Preloaded {
			want[im.Digest] = im
		}
	}
	n.checkPodmanImages(t, want)
}

// checkPodmanImages: podman, reading the node's store, lists each image by
// its name and digest.
func (n *importNode) checkPodmanImages(t *testing.T, images map[string]contract.Image) {
	t.Helper()
	out := n.podman(t, "images", "--digests", "--format", "{{.Repository}}:{{.Tag}} {{.Digest}}")
	for _, im := range images {
		if !strings.Contains(string(out), im.Name+" "+im.Digest) {
			t.Errorf("podman does not list %s %s:\n%s", im.Name, im.Digest, out)
		}
	}
}

// podman runs podman on the node's store (as the node's storage.conf says,
// under the node's root) and returns its output.
func (n *importNode) podman(t *testing.T, args ...string) string {
	t.Helper()
	conf := filepath.Join(n.root, "test-storage.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("[storage]\ndriver = \"overlay\"\ngraphroot = %q\nrunroot = %q\n",
		filepath.Join(n.root, "var/lib/containers/storage"), filepath.Join(n.root, "run/containers/storage"))), 0o644)
	cmd := exec.Command("podman", append([]string{"--tmpdir", filepath.Join(n.root, "test-podman-tmp"), "--events-backend", "none",
		"--cgroup-manager", "cgroupfs"}, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERS_STORAGE_CONF="+conf)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// preloadApp marks the recipe's app image preloaded (the node loads it
// into containers/storage at import).
func preloadApp(t *testing.T, recipe string) string {
	t.Helper()
	data, err := os.ReadFile(recipe)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "    source: oci:") && strings.Contains(l, ":"+appImage) {
			lines[i] = l + "\n    preload: true"
		}
	}
	out := strings.Join(lines, "\n")
	if out == string(data) {
		t.Fatalf("no app image in %s", recipe)
	}
	os.WriteFile(recipe, []byte(out), 0o644)
	return recipe
}

var noPins = release.PinApplierFunc(func(context.Context) error { return nil })

func (n *importNode) mustKiln(t *testing.T, rs *releases, args ...string) string {
	t.Helper()
	out, code := n.kiln(t, rs, args...)
	if code != 0 {
		t.Fatalf("kiln %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

func (n *importNode) mustRelease(t *testing.T, rs *releases, args ...string) {
	t.Helper()
	n.mustKiln(t, rs, append([]string{"agent", "release"}, args...)...)
}

func (n *importNode) setupTrust(t *testing.T, pub string) {
	t.Helper()
	pem, err := os.ReadFile(pub)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.root, contract.TrustDir)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, contract.TrustFileName(pem)), pem, 0o644)
}

func (n *importNode) editContents(t *testing.T, edit func(c *contract.Contents)) {
	t.Helper()
	img := filepath.Join(n.root, contract.MountPoint)
	c, err := contract.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	edit(c)
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(img, contract.ContentsFile), data, 0o644)
}

// smallVar mounts a tmpfs of size on the node's /var.
func (n *importNode) smallVar(t *testing.T, size string) {
	t.Helper()
	v := filepath.Join(n.root, "var")
	os.MkdirAll(v, 0o755)
	run(t, "mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", v)
	t.Cleanup(func() { exec.Command("umount", v).Run() })
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// flipSignedByte changes a digit of the manifest's version inside the
// signed payload (base64 in the envelope: change one payload character).
func flipSignedByte(t *testing.T, p string) {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, []byte(`"payload":"`))
	if i < 0 {
		t.Fatal("no payload in the envelope")
	}
	i += len(`"payload":"`) + 40
	if data[i] == 'A' {
		data[i] = 'B'
	} else {
		data[i] = 'A'
	}
	os.WriteFile(p, data, 0o644)
}

func diffSnapshot(a, b map[string]string) string {
	var d []string
	for k, v := range a {
		if b[k] != v {
			d = append(d, fmt.Sprintf("%s: %s -> %s", k, v, b[k]))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			d = append(d, fmt.Sprintf("%s: new %s", k, v))
		}
	}
	sort.Strings(d)
	return strings.Join(d, "\n")
}
