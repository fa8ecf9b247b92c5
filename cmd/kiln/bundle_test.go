//go:build !nodeonly

package main

// Black-box tests of kiln bundle / key / inspect / verify on bundles: a
// factory disk for release 1.0, a delta bundle for 1.1 and a full bundle for
// 1.2, checked with sgdisk, the kernel's squashfs and skopeo.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/layers"
	"github.com/kiln-appliance/kiln/test/loopmount"
)

// releases is one set of inputs: a base disk, a layout with every image
// any release uses, a key pair, and a recipe per release.
type releases struct {
	dir, cache, key, pub, otherKey, otherPub string
	layout                                   string
	images                                   map[string]layers.Written
}

const (
	baseImage = "quay.io/acme/base:1" // in every release, unchanged
	appImage  = "quay.io/acme/app:"   // + release version
)

func newReleases(t *testing.T) *releases {
	t.Helper()
	dir := t.TempDir()
	rs := &releases{dir: dir, cache: filepath.Join(dir, "cache"), layout: filepath.Join(dir, "oci"), images: map[string]layers.Written{}}
	if err := basedisk.Write(filepath.Join(dir, "base.raw")); err != nil {
		t.Fatal(err)
	}
	for i, ref := range []string{baseImage, appImage + "1.0", appImage + "1.1", appImage + "1.2"} {
		w, err := layers.Random(rs.layout, ref, uint64(i+1), 2, 300<<10)
		if err != nil {
			t.Fatal(err)
		}
		rs.images[ref] = w
	}
	f := &fixture{dir: dir, cache: rs.cache}
	mustKiln(t, f, "key", "generate", filepath.Join(dir, "factory"))
	mustKiln(t, f, "key", "generate", filepath.Join(dir, "other"))
	rs.key, rs.pub = filepath.Join(dir, "factory.key"), filepath.Join(dir, "factory.pub")
	rs.otherKey, rs.otherPub = filepath.Join(dir, "other.key"), filepath.Join(dir, "other.pub")
	os.WriteFile(filepath.Join(dir, "app.container"), []byte("[Container]\nImage=quay.io/acme/app\n"), 0o644)
	return rs
}

// recipe writes the recipe of one release in its own directory (a release
// is usually a commit of the same recipe) and returns its path.
func (rs *releases) recipe(t *testing.T, name, version, extra string) string {
	t.Helper()
	d := filepath.Join(rs.dir, name+"-"+version)
	os.MkdirAll(d, 0o755)
	app := appImage + version[:3] // 1.1.0 runs app:1.1
	if _, ok := rs.images[app]; !ok {
		app = appImage + "1.1"
	}
	y := fmt.Sprintf(`apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: %s
version: %s
base:
  path: %s/base.raw
images:
  - name: %s
    source: oci:%s:%s
  - name: %s
    source: oci:%s:%s
trust: [%s]
%s`, name, version, rs.dir, baseImage, rs.layout, baseImage, app, rs.layout, app, rs.pub, extra)
	p := filepath.Join(d, "appliance.yaml")
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// disk10Lock11 builds release 1.0's disk and locks release 1.1 (both with
// releaseFiles), where an upgrade starts; it returns 1.1's recipe and the disk.
func (rs *releases) disk10Lock11(t *testing.T) (r11, disk10 string) {
	t.Helper()
	r10 := rs.recipe(t, "acme", "1.0.0", releaseFiles)
	r11 = rs.recipe(t, "acme", "1.1.0", releaseFiles)
	disk10 = filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10)
	rs.mustKiln(t, "lock", r11)
	return r11, disk10
}

const releaseFiles = `release:
  files:
    - path: /etc/containers/systemd/app.container
      source: ../app.container
`

func (rs *releases) kiln(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return kiln(t, &fixture{dir: rs.dir, cache: rs.cache}, args...)
}

func (rs *releases) mustKiln(t *testing.T, args ...string) string {
	t.Helper()
	return mustKiln(t, &fixture{dir: rs.dir, cache: rs.cache}, args...)
}

// mountBundle loop-mounts a bundle's filesystem read-only with the kernel's
// squashfs driver.
func mountBundle(t *testing.T, p string) string {
	t.Helper()
	rep, err := bundle.Inspect(p)
	if err != nil {
		t.Fatal(err)
	}
	return loopmount.Squashfs(t, p, rep.Offset+rep.Header, rep.Manifest.Filesystem.Size)
}

func blobsIn(t *testing.T, dir string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "oci", "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out["sha256:"+e.Name()] = true
	}
	return out
}

func (rs *releases) blobsOf(ref string) []string {
	w := rs.images[ref]
	out := []string{w.Digest.String(), w.ConfigID.String()}
	for _, l := range w.Layers {
		out = append(out, l.String())
	}
	return out
}

func inspectBundle(t *testing.T, rs *releases, p string) *bundle.Report {
	t.Helper()
	var rep bundle.Report
	out := rs.mustKiln(t, "inspect", "-o", "json", p)
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("inspect -o json: %v\n%s", err, out)
	}
	return &rep
}

func TestBundles(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", releaseFiles)
	r11 := rs.recipe(t, "acme", "1.1.0", releaseFiles)
	r12 := rs.recipe(t, "acme", "1.2.0", releaseFiles)
	disk10 := filepath.Join(rs.dir, "disk-1.0.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10)
	rs.mustKiln(t, "lock", r11)
	rs.mustKiln(t, "lock", r12)

	b11 := filepath.Join(rs.dir, "upgrade-1.1.img")
	b12 := filepath.Join(rs.dir, "upgrade-1.2.img")
	b12file := filepath.Join(rs.dir, "upgrade-1.2.kbundle")
	out := rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key, "--from", disk10)
	if !strings.Contains(out, "delta bundle") {
		t.Errorf("bundle output does not say it is a delta:\n%s", out)
	}
	if strings.Contains(out, "OS slot") {
		t.Errorf("a base without slots: the progress names a step about OS slots:\n%s", out)
	}
	rs.mustKiln(t, "bundle", r12, "-o", b12, "--key", rs.key)
	rs.mustKiln(t, "bundle", r12, "-o", b12file, "--key", rs.key, "--format", "file")

	t.Run("factory disk carries trust and release files", func(t *testing.T) {
		ign, err := bootconfig.Read(disk10)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{contract.TrustDir + "/", "/etc/containers/systemd/app.container"} {
			if !strings.Contains(string(ign), want) {
				t.Errorf("the factory Ignition config has no %s", want)
			}
		}
		p := filepath.Join(rs.dir, "config.ign")
		os.WriteFile(p, ign, 0o644)
		run(t, "ignition-validate", p)
	})

	t.Run("stick images are real GPT disks", func(t *testing.T) {
		for _, p := range []string{b11, b12} {
			if out := run(t, "sgdisk", "-v", p); !strings.Contains(out, "No problems found") {
				t.Errorf("sgdisk -v %s:\n%s", p, out)
			}
			info := run(t, "sgdisk", "-i", "1", p)
			if !strings.Contains(info, bundlefmt.PartitionType) || !strings.Contains(info, bundlefmt.PartitionName) {
				t.Errorf("%s partition 1 is not kiln's bundle partition:\n%s", p, info)
			}
		}
	})

	t.Run("a full bundle holds every image, read by skopeo from the kernel mount", func(t *testing.T) {
		mnt := mountBundle(t, b12)
		rep := inspectBundle(t, rs, b12)
		if rep.Manifest.Kind != bundlefmt.KindFull || len(rep.Manifest.AppliesTo) != 0 {
			t.Errorf("full bundle: kind %s, applies to %v", rep.Manifest.Kind, rep.Manifest.AppliesTo)
		}
		for _, ref := range []string{baseImage, appImage + "1.2"} {
			run(t, "skopeo", "copy", "--quiet", "oci:"+filepath.Join(mnt, "oci")+":"+ref, "dir:"+t.TempDir())
		}
		got, err := os.ReadFile(filepath.Join(mnt, "release", "etc/containers/systemd/app.container"))
		if want, _ := os.ReadFile(filepath.Join(rs.dir, "app.container")); err != nil || string(got) != string(want) {
			t.Errorf("release file on the stick: %q, %v", got, err)
		}
		if fi, err := os.Stat(filepath.Join(mnt, bundlefmt.AgentBinary)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("agent on the stick: %v %v", fi, err)
		}
	})

	t.Run("the delta and the 1.0 disk hold every blob of 1.1, the delta only what 1.0 lacks", func(t *testing.T) {
		deltaMnt := mountBundle(t, b11)
		delta := blobsIn(t, deltaMnt)
		factory := blobsIn(t, mountImagePartition(t, disk10))
		for _, ref := range []string{baseImage, appImage + "1.1"} {
			for _, d := range rs.blobsOf(ref) {
				if !delta[d] && !factory[d] {
					t.Errorf("%s blob %s is neither on the 1.0 disk nor in the delta", ref, d)
				}
				if delta[d] && factory[d] {
					t.Errorf("%s blob %s is on the 1.0 disk and in the delta too", ref, d)
				}
			}
		}
		rep := inspectBundle(t, rs, b11)
		m := rep.Manifest
		if _, err := os.Stat(filepath.Join(deltaMnt, bundlefmt.AgentBinary)); m.AgentOnStick || err == nil {
			t.Errorf("the delta carries the agent its base already runs")
		}
		if m.Kind != bundlefmt.KindDelta || len(m.AppliesTo) != 1 || m.AppliesTo[0].Version != "1.0.0" {
			t.Errorf("delta: kind %s, applies to %+v", m.Kind, m.AppliesTo)
		}
		var onStick int64
		for _, b := range m.Blobs {
			if b.OnStick != delta[b.Digest] {
				t.Errorf("blob %s: manifest says onStick=%v, the stick disagrees", b.Digest, b.OnStick)
			}
			if b.OnStick {
				onStick += b.Size
			}
		}
		if m.Space.CopyBytes != onStick || m.Space.UnpackedBytes < 2*300<<10 {
			t.Errorf("space: %+v (blobs on the stick: %d bytes; two 300 KiB layers unpack to more than 600 KiB)", m.Space, onStick)
		}
	})

	t.Run("from the lock, the kiln.json or both: the same delta", func(t *testing.T) {
		mnt := mountImagePartition(t, disk10)
		for i, from := range [][]string{
			{"--from", filepath.Join(mnt, "kiln.json")},
			{"--from", recipesLock(r10)},
			{"--from", recipesLock(r10), "--from", disk10},
		} {
			p := filepath.Join(rs.dir, fmt.Sprintf("from-%d.img", i))
			rs.mustKiln(t, append([]string{"bundle", r11, "-o", p, "--key", rs.key}, from...)...)
			if i == 0 {
				if a, b := sha256File(t, p), sha256File(t, b11); a != b {
					t.Errorf("bundle %v differs from the bundle --from the disk", from)
				}
				continue
			}
			// A lock does not say which agent its nodes run: the agent comes
			// along, the blobs are the same.
			got, want := inspectBundle(t, rs, p).Manifest, inspectBundle(t, rs, b11).Manifest
			if !got.AgentOnStick || !slices.Equal(got.Blobs, want.Blobs) || !slices.Equal(got.AppliesTo, want.AppliesTo) {
				t.Errorf("bundle %v: agent on stick %v, blobs or appliesTo differ from the bundle --from the disk", from, got.AgentOnStick)
			}
		}
	})

	t.Run("the disk says whom its nodes trust", func(t *testing.T) {
		r13 := rs.recipe(t, "acme", "1.3.0", releaseFiles)
		replaceInFile(t, r13, "trust: ["+rs.pub+"]", "trust: ["+rs.otherPub+"]")
		rs.mustKiln(t, "lock", r13)
		p := filepath.Join(rs.dir, "rotate.img")
		if out, code := rs.kiln(t, "bundle", r13, "-o", p, "--key", rs.otherKey, "--from", disk10); code != 1 || !strings.Contains(out, "not trusted by the nodes running 1.0.0") {
			t.Errorf("signed with a key the 1.0 disk does not trust: exit %d\n%s", code, out)
		}
		rs.mustKiln(t, "bundle", r13, "-o", p, "--key", rs.key, "--from", disk10)
	})

	t.Run("inspect and verify", func(t *testing.T) {
		text := rs.mustKiln(t, "inspect", b11)
		for _, want := range []string{"acme 1.1.0", "delta bundle", "Applies to: 1.0.0", appImage + "1.1", "/etc/containers/systemd/app.container"} {
			if !strings.Contains(text, want) {
				t.Errorf("inspect lacks %q:\n%s", want, text)
			}
		}
		for _, p := range []string{b11, b12, b12file} {
			if out := rs.mustKiln(t, "verify", p, "--key", rs.otherPub, "--key", rs.pub); !strings.Contains(out, "OK") {
				t.Errorf("verify %s: %s", p, out)
			}
			out, code := rs.kiln(t, "verify", p, "--key", rs.otherPub)
			if code != 1 || !strings.Contains(out, "signature") {
				t.Errorf("verify %s with an untrusted key: exit %d\n%s", p, code, out)
			}
			if out, code := rs.kiln(t, "verify", p); code != 2 || !strings.Contains(out, "--key") {
				t.Errorf("verify %s without a key: exit %d\n%s", p, code, out)
			}
		}
	})

	t.Run("a disk's inspect and verify --key say whom its nodes trust", func(t *testing.T) {
		data, err := os.ReadFile(rs.pub)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := bundlefmt.ParsePublicKey(data)
		if err != nil {
			t.Fatal(err)
		}
		id, err := bundlefmt.KeyID(pub)
		if err != nil {
			t.Fatal(err)
		}
		text := rs.mustKiln(t, "inspect", disk10)
		for _, want := range []string{"Release files:\n  /etc/containers/systemd/app.container (0644, ", "Trusted keys (its nodes accept upgrade bundles signed with these):\n  " + id + "\n"} {
			if !strings.Contains(text, want) {
				t.Errorf("inspect of the disk lacks %q:\n%s", want, text)
			}
		}
		if out := rs.mustKiln(t, "verify", disk10, "--key", rs.pub); !strings.Contains(out, "key ID "+id+") is trusted") || !strings.Contains(out, "OK") {
			t.Errorf("verify --key with the key the disk trusts:\n%s", out)
		}
		if out, code := rs.kiln(t, "verify", disk10, "--key", rs.pub, "--key", rs.otherPub); code != 1 || !strings.Contains(out, "does not trust "+rs.otherPub) || !strings.Contains(out, "it trusts "+id) {
			t.Errorf("verify --key with a key the disk does not trust: exit %d\n%s", code, out)
		}
	})

	t.Run("reproducible, and the file is the stick's partition", func(t *testing.T) {
		again := filepath.Join(rs.dir, "again.img")
		rs.mustKiln(t, "bundle", r12, "-o", again, "--key", rs.key)
		if a, b := sha256File(t, b12), sha256File(t, again); a != b {
			t.Errorf("two bundles of the same inputs differ: %s, %s", a, b)
		}
		rep := inspectBundle(t, rs, b12)
		part := filepath.Join(rs.dir, "part.bin")
		fi, _ := os.Stat(b12file)
		run(t, "dd", "if="+b12, "of="+part, "bs=4096", fmt.Sprintf("skip=%d", rep.Offset/4096), fmt.Sprintf("count=%d", fi.Size()/4096), "status=none")
		if a, b := sha256File(t, part), sha256File(t, b12file); a != b {
			t.Errorf("--format file differs from the stick's partition content")
		}
	})

	t.Run("one flipped bit anywhere is found", func(t *testing.T) {
		rep := inspectBundle(t, rs, b11)
		fi, _ := os.Stat(b11)
		fsStart := rep.Offset + rep.Header
		fsEnd := fsStart + rep.Manifest.Filesystem.Size
		for _, c := range []struct {
			where string
			off   int64
			want  string
		}{
			{"protective MBR", 0x1be + 4, "layout"},
			{"MBR boot code", 10, "layout"},
			{"GPT header", 512 + 20, "GPT"},
			{"GPT entries", 1024 + 60, "GPT"},
			{"gap before the partition", 64 << 10, "partition table"},
			{"bundle magic", rep.Offset + 1, "bundle"},
			{"header size", rep.Offset + 12, "bundle header"},
			{"envelope", rep.Offset + 200, "signature"},
			{"header padding", fsStart - 1, "bundle header"},
			{"squashfs superblock", fsStart + 40, "content"},
			{"first file data", fsStart + 4096, "content"},
			{"middle of the filesystem", (fsStart + fsEnd) / 2, "content"},
			{"squashfs tables", fsEnd - 100, "content"},
			{"backup GPT", fi.Size() - 512 + 20, "backup partition table"},
		} {
			t.Run(c.where, func(t *testing.T) {
				bad := filepath.Join(t.TempDir(), "bad.img")
				run(t, "cp", "--sparse=always", b11, bad)
				fd, err := os.OpenFile(bad, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				b := make([]byte, 1)
				fd.ReadAt(b, c.off)
				b[0] ^= 0x10
				fd.WriteAt(b, c.off)
				fd.Close()
				out, code := rs.kiln(t, "verify", bad, "--key", rs.pub)
				t.Logf("%s", out)
				if code != 1 {
					t.Fatalf("flipped bit at byte %d: exit %d, want 1\n%s", c.off, code, out)
				}
				if !strings.Contains(out, c.want) {
					t.Errorf("flipped bit at byte %d: message does not name %q:\n%s", c.off, c.want, out)
				}
			})
		}
	})
}

func TestBundleBadInput(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", "")
	r11 := rs.recipe(t, "acme", "1.1.0", "")
	other := rs.recipe(t, "other", "0.1.0", "")
	arm := rs.recipe(t, "acme", "0.9.0", "arch: arm64\n")
	same := rs.recipe(t, "acme", "1.1.1", "") // the same images as 1.1.0 (app:1.1)
	for _, r := range []string{r10, r11, other, same} {
		rs.mustKiln(t, "lock", r)
	}
	// An old release's lock whose recipe names its key relative to it, the key not copied along.
	keyless := rs.recipe(t, "acme", "0.8.0", "")
	replaceInFile(t, keyless, "trust: ["+rs.pub+"]", "trust: [keys/factory.pub]")
	rs.mustKiln(t, "lock", keyless)
	b11 := filepath.Join(rs.dir, "b11.img")
	rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key)
	// arm64 images do not exist: a kiln.json claiming to be the arm64 release will do.
	armJSON := filepath.Join(rs.dir, "arm-kiln.json")
	os.WriteFile(armJSON, []byte(`{"schemaVersion":1,"recipe":"acme","version":"0.9.0","arch":"arm64","lockDigest":"sha256:`+strings.Repeat("0", 64)+`","created":0,"images":[],"files":[],"registry":{"listen":"127.0.0.1:5050","alwaysOn":false,"mirrorTags":true,"upstreams":[]}}`), 0o644)
	_ = arm
	dev := filepath.Join(rs.dir, "stick")
	run(t, "mknod", dev, "b", "7", "250")
	outDir := filepath.Join(rs.dir, "outdir")
	os.Mkdir(outDir, 0o755)

	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"from another recipe", []string{"bundle", r11, "--key", rs.key, "--from", recipesLock(other)}, 1, `is recipe "other", the bundle is for "acme"`},
		{"from another arch", []string{"bundle", r11, "--key", rs.key, "--from", armJSON}, 1, "is for arm64, the recipe for amd64"},
		{"not newer than from", []string{"bundle", r10, "--key", rs.key, "--from", b11}, 1, "recipe version 1.0.0 is not newer than --from"},
		{"same version as from", []string{"bundle", r11, "--key", rs.key, "--from", b11}, 1, "recipe version 1.1.0 is not newer"},
		{"missing key file", []string{"bundle", r11, "--key", filepath.Join(rs.dir, "nope.key")}, 1, "signing key"},
		{"no key", []string{"bundle", r11}, 2, "key"},
		{"public key to sign", []string{"bundle", r11, "--key", rs.pub}, 1, "this is a public key"},
		{"untrusted key", []string{"bundle", r11, "--key", rs.otherKey}, 1, "is not in the recipe's trust"},
		{"key the base does not trust", []string{"bundle", same, "--key", rs.otherKey, "--from", b11}, 1, "is not trusted by the nodes running 1.1.0"},
		{"empty bundle", []string{"bundle", same, "--key", rs.key, "--from", b11}, 1, "the bundle would be empty"},
		{"output is a directory", []string{"bundle", r11, "--key", rs.key, "-o", outDir}, 1, "is a directory"},
		{"output is a block device", []string{"bundle", r11, "--key", rs.key, "-o", dev}, 1, "not a regular file"},
		{"bad format", []string{"bundle", r11, "--key", rs.key, "--format", "iso"}, 2, "--format"},
		{"from a lock without its recipe's key", []string{"bundle", r11, "--key", rs.key, "--from", recipesLock(keyless)}, 1,
			"acme-0.8.0/keys/factory.pub: no such file or directory; --from a lock reads the old release's recipe beside it"},
		{"from is not a release", []string{"bundle", r11, "--key", rs.key, "--from", rs.pub}, 1, "not a kiln disk, kiln.json, bundle or lock file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			out := filepath.Join(rs.dir, "out.img")
			if !slices.Contains(args, "-o") {
				args = append(args, "-o", out)
			}
			msg, code := rs.kiln(t, args...)
			t.Logf("%s", msg)
			if code != c.code || !strings.Contains(msg, c.want) {
				t.Errorf("exit %d, want %d with %q:\n%s", code, c.code, c.want, msg)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("a failed bundle left %s", out)
			}
			if tmps, _ := filepath.Glob(filepath.Join(rs.dir, ".*kiln-tmp-*")); len(tmps) > 0 {
				t.Errorf("temp files left: %v", tmps)
			}
		})
	}
	if fi, err := os.Stat(dev); err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Errorf("the block device node was replaced: %v %v", fi, err)
	}
}

func recipesLock(recipe string) string { return strings.TrimSuffix(recipe, ".yaml") + ".lock" }

// Ctrl-C during a bundle leaves the previous output as it was, no temp file
// and no staging tree, whichever long step it interrupts.
func TestBundleInterruptLeavesNothing(t *testing.T) {
	rs := newReleases(t)
	r11 := rs.recipe(t, "acme", "1.1.0", releaseFiles)
	rs.mustKiln(t, "lock", r11)
	out := filepath.Join(rs.dir, "out.img")
	os.WriteFile(out, []byte("previous disk"), 0o644)
	for _, step := range []string{"stage bundle", "write bundle filesystem"} {
		if code, log := interruptAt(t, rs.cache, step, "bundle", r11, "-o", out, "--key", rs.key); code != 130 {
			t.Errorf("SIGINT when %q started: exit %d, want 130\n%s", step, code, log)
		}
		assertUntouched(t, rs.dir, out)
		if left, _ := filepath.Glob(filepath.Join(rs.cache, "kiln", "bundle-*")); len(left) > 0 {
			t.Errorf("SIGINT when %q started: staging left behind: %v", step, left)
		}
	}
}

// Key rotation: release 1.2 trusts only a new key; its bundle is signed with
// the old key, which the 1.1 nodes trust, and carries the new set.
func TestBundleKeyRotation(t *testing.T) {
	rs := newReleases(t)
	r11 := rs.recipe(t, "acme", "1.1.0", releaseFiles)
	r12 := rs.recipe(t, "acme", "1.2.0", releaseFiles)
	replaceInFile(t, r12, "trust: ["+rs.pub+"]", "trust: ["+rs.otherPub+"]")
	rs.mustKiln(t, "lock", r11)
	rs.mustKiln(t, "lock", r12)
	b11 := filepath.Join(rs.dir, "b11.img")
	rs.mustKiln(t, "bundle", r11, "-o", b11, "--key", rs.key)

	b12 := filepath.Join(rs.dir, "b12.img")
	if out, code := rs.kiln(t, "bundle", r12, "-o", b12, "--key", rs.key); code != 1 || !strings.Contains(out, "not in the recipe's trust") {
		t.Errorf("old key, nothing says the nodes trust it: exit %d\n%s", code, out)
	}
	if out, code := rs.kiln(t, "bundle", r12, "-o", b12, "--key", rs.otherKey, "--from", b11); code != 1 || !strings.Contains(out, "not trusted by the nodes running 1.1.0") {
		t.Errorf("new key, which the 1.1 nodes do not trust: exit %d\n%s", code, out)
	}
	rs.mustKiln(t, "bundle", r12, "-o", b12, "--key", rs.key, "--from", b11)
	rs.mustKiln(t, "verify", b12, "--key", rs.pub)
	if out, code := rs.kiln(t, "verify", b12, "--key", rs.otherPub); code != 1 {
		t.Errorf("verify with the new key: exit %d\n%s", code, out)
	}
	m := inspectBundle(t, rs, b12).Manifest
	otherPEM, _ := os.ReadFile(rs.otherPub)
	if len(m.Trust) != 1 || m.Trust[0].PublicKey != string(otherPEM) {
		t.Errorf("the 1.2 bundle carries trust %+v, want only the new key", m.Trust)
	}
}

// A delta --from two releases applies to nodes of each: it carries every
// blob one of them lacks. Release 1.2 keeps app:1.1 beside app:1.2, so the
// 1.1 disk holds blobs the 1.0 disk lacks; a 1.0 node and a 1.1 node both
// stage the one bundle.
func TestDeltaFromTwoReleases(t *testing.T) {
	rs := newReleases(t)
	r10 := rs.recipe(t, "acme", "1.0.0", releaseFiles)
	r11 := rs.recipe(t, "acme", "1.1.0", releaseFiles)
	r12 := rs.recipe(t, "acme", "1.2.0", releaseFiles)
	replaceInFile(t, r12, "trust: [", fmt.Sprintf("  - name: %[1]s1.1\n    source: oci:%[2]s:%[1]s1.1\ntrust: [", appImage, rs.layout))
	disk10, disk11 := filepath.Join(rs.dir, "disk-1.0.raw"), filepath.Join(rs.dir, "disk-1.1.raw")
	rs.mustKiln(t, "build", r10, "-o", disk10)
	rs.mustKiln(t, "build", r11, "-o", disk11)
	rs.mustKiln(t, "lock", r12)
	b12 := filepath.Join(rs.dir, "upgrade-1.2.img")
	rs.mustKiln(t, "bundle", r12, "-o", b12, "--key", rs.key, "--from", disk10, "--from", disk11)

	on10, on11 := blobsIn(t, mountImagePartition(t, disk10)), blobsIn(t, mountImagePartition(t, disk11))
	stick := blobsIn(t, mountBundle(t, b12))
	for _, ref := range []string{baseImage, appImage + "1.1", appImage + "1.2"} {
		for _, d := range rs.blobsOf(ref) {
			if want := !on10[d] || !on11[d]; stick[d] != want {
				t.Errorf("%s blob %s: on the stick %v, want %v (on 1.0: %v, on 1.1: %v)", ref, d, stick[d], want, on10[d], on11[d])
			}
		}
	}
	m := inspectBundle(t, rs, b12).Manifest
	if len(m.AppliesTo) != 2 {
		t.Errorf("applies to %+v, want 1.0.0 and 1.1.0", m.AppliesTo)
	}
	dev := attachStick(t, b12)
	for _, disk := range []string{disk10, disk11} {
		n := newImportNode(t, disk, rs.pub)
		if out, code := n.kiln(t, rs, "agent", "import", dev); code != 0 {
			t.Errorf("import on the node of %s: exit %d\n%s", filepath.Base(disk), code, out)
			continue
		}
		if s := n.state(t); s.Staged == nil || s.Staged.Version != "1.2.0" {
			t.Errorf("the node of %s staged %+v, want 1.2.0", filepath.Base(disk), s.Staged)
		}
		n.checkStore(t)
	}
}

// The bundle says which kiln made it and which agent it carries (edition,
// version, size), in its summary line and in inspect; without kiln-agent
// beside kiln it refuses rather than ship the factory binary unasked.
func TestBundleSaysWhichAgent(t *testing.T) {
	rs := newReleases(t)
	r11, disk10 := rs.disk10Lock11(t)
	self := kilnVersion(t, kilnBin)
	agent := kilnVersion(t, filepath.Join(filepath.Dir(kilnBin), "kiln-agent"))
	agentSize := fileBytes(t, filepath.Join(filepath.Dir(kilnBin), "kiln-agent"))

	full := filepath.Join(rs.dir, "full.img")
	out := rs.mustKiln(t, "bundle", r11, "-o", full, "--key", rs.key)
	if want := "agent: " + agent.String() + ", " + agentSize + ", on the stick\n"; !strings.Contains(out, want) {
		t.Errorf("the summary does not say %q:\n%s", want, out)
	}
	m := inspectBundle(t, rs, full).Manifest
	if m.SchemaVersion != bundlefmt.NoOSSchemaVersion || m.Kiln != self || m.AgentVersion != agent || m.AgentVersion.Edition != "node" {
		t.Errorf("manifest schema %d, kiln %+v, agent %+v; want schema %d, %+v, %+v", m.SchemaVersion, m.Kiln, m.AgentVersion, bundlefmt.NoOSSchemaVersion, self, agent)
	}
	text := rs.mustKiln(t, "inspect", full)
	for _, want := range []string{"Made by: " + self.String() + "\n", "Agent: " + agent.String() + ", " + agentSize + ", on the stick\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect lacks %q:\n%s", want, text)
		}
	}

	delta := filepath.Join(rs.dir, "delta.img")
	out = rs.mustKiln(t, "bundle", r11, "-o", delta, "--key", rs.key, "--from", disk10)
	if !strings.Contains(out, "agent: "+agent.String()+", "+agentSize+", not on the stick") {
		t.Errorf("the delta's summary does not say its agent stays off the stick:\n%s", out)
	}

	// kiln alone, without the node edition beside it.
	lone := filepath.Join(t.TempDir(), "kiln")
	copyFile(t, kilnBin, lone)
	os.Chmod(lone, 0o755)
	runLone := func(args ...string) (string, int) {
		cmd := exec.Command(lone, args...)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+rs.cache)
		b, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return string(b), cmd.ProcessState.ExitCode()
	}
	p := filepath.Join(rs.dir, "lone.img")
	for _, args := range [][]string{
		{"bundle", r11, "-o", p, "--key", rs.key},
		{"build", r11, "-o", p},
	} {
		out, code := runLone(args...)
		if code != 1 || !strings.Contains(out, "no kiln-agent beside "+lone) || !strings.Contains(out, "--agent") {
			t.Errorf("%s without kiln-agent: exit %d\n%s", args[0], code, out)
		}
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s without kiln-agent wrote %s", args[0], p)
		}
	}
	// Asked for by name, the factory binary goes, and the summary says so.
	out, code := runLone("bundle", r11, "-o", p, "--key", rs.key, "--agent", lone)
	if code != 0 || !strings.Contains(out, "agent: "+self.String()+", "+fileBytes(t, lone)+", on the stick") || !strings.Contains(out, "factory edition") {
		t.Errorf("bundle --agent kiln: exit %d\n%s", code, out)
	}

	// Not kiln at all: refused, naming it.
	if out, code := rs.kiln(t, "bundle", r11, "-o", p, "--key", rs.key, "--agent", "/bin/true"); code != 1 || !strings.Contains(out, "agent binary /bin/true is not kiln") {
		t.Errorf("bundle --agent /bin/true: exit %d\n%s", code, out)
	}
}

// A delta for nodes whose agent predates manifest schema 2 (their kiln.json
// has no kiln record) is written as schema 1, which those agents read, and
// imports; one for newer nodes is schema 2 (3 only with an OS section).
func TestBundleSchemaForOlderNodes(t *testing.T) {
	rs := newReleases(t)
	r11, disk10 := rs.disk10Lock11(t)

	data, err := os.ReadFile(filepath.Join(mountImagePartition(t, disk10), "kiln.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]json.RawMessage
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	if v := kilnVersion(t, kilnBin); string(c["kiln"]) == "" || !strings.Contains(string(c["kiln"]), `"version": "`+v.Version+`"`) {
		t.Fatalf("kiln.json does not record the kiln that built it (%s): %s", v, c["kiln"])
	}
	delete(c, "kiln") // as a kiln before schema 2 wrote it
	old := filepath.Join(rs.dir, "old-kiln.json")
	b, _ := json.Marshal(c)
	os.WriteFile(old, b, 0o644)

	for _, tc := range []struct {
		from   string
		schema int
	}{{old, 1}, {disk10, bundlefmt.NoOSSchemaVersion}} {
		p := filepath.Join(rs.dir, fmt.Sprintf("schema-%d.img", tc.schema))
		rs.mustKiln(t, "bundle", r11, "-o", p, "--key", rs.key, "--from", tc.from)
		rep := inspectBundle(t, rs, p)
		if m := rep.Manifest; m.SchemaVersion != tc.schema || (tc.schema == 1) != (m.Kiln == version.Info{}) {
			t.Errorf("--from %s: schema %d, kiln %+v; want schema %d", filepath.Base(tc.from), m.SchemaVersion, m.Kiln, tc.schema)
		}
		text := rs.mustKiln(t, "inspect", p)
		if tc.schema == 1 && (!strings.Contains(text, "Made by: not recorded (manifest schema 1)") || !strings.Contains(text, "version not recorded")) {
			t.Errorf("inspect of a schema 1 bundle:\n%s", text)
		}
		n := newImportNode(t, disk10, rs.pub)
		if out, code := n.kiln(t, rs, "agent", "import", attachStick(t, p)); code != 0 {
			t.Errorf("import of the schema %d bundle: exit %d\n%s", tc.schema, code, out)
		}
	}
}

// kilnVersion is what a kiln binary says of itself with --version.
func kilnVersion(t *testing.T, bin string) version.Info {
	t.Helper()
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	v, err := version.ParseText(string(out))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
