package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkServeStartup: from exec to the first 200 on GET /v2/, for the
// node's registry (kiln-agent serve) and for the reference registry,
// distribution 2.8 (Debian's docker-registry, which reads nothing at start),
// holding the same 2, 200 and 2,000 images. kiln runs twice: "prebuilt", the
// layout with the registry index the factory writes (stage.WriteRegistryIndex,
// the builder's own call), as on a node; "indexed", the same layout without
// it, which kiln indexes at start (every manifest read and checked, every
// blob lstat'ed: a partition built before the index, or a plain layout).
// Both registries are polled the same way; runs are paired and the ratio
// kiln/distribution is reported as median and range.
//
//	go test -tags … -run '^$' -bench ServeStartup -benchtime 1x ./cmd/kiln
func BenchmarkServeStartup(b *testing.B) {
	dist, err := exec.LookPath("docker-registry")
	if err != nil {
		b.Fatalf("distribution's registry is needed as the baseline: %v (apt-get install docker-registry; make bench does)", err)
	}
	agent := filepath.Join(filepath.Dir(kilnBin), "kiln-agent")
	for _, n := range []int{2, 200, 2000} {
		b.Run(fmt.Sprintf("%dimages", n), func(b *testing.B) {
			dir := b.TempDir()
			oci := filepath.Join(dir, "oci")
			t0 := time.Now()
			imgs, err := images.RandomImages(oci, n, int64(n)*4096, 0.3, 1)
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			distRoot := fillDistribution(b, dist, dir, oci, imgs)
			b.Logf("%d images: layout written in %v, distribution filled and checked in %v", n, t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
			t2 := time.Now()
			if err := stage.WriteRegistryIndex(oci); err != nil {
				b.Fatal(err)
			}
			b.Logf("%d images: registry index written in %v", n, time.Since(t2).Round(time.Millisecond))
			index := filepath.Join(oci, regindex.FileName)
			servesFromIndex(b, agent, oci, imgs)
			kiln := func() time.Duration {
				addr := freePort(b)
				return startToReady(b, addr, agent, "serve", "--listen", addr, oci)
			}
			distribution := func() time.Duration {
				addr := freePort(b)
				return startToReady(b, addr, dist, "serve", distConfig(b, dir, distRoot, addr))
			}
			for i := 0; i < b.N; i++ {
				for _, start := range []string{"prebuilt", "indexed"} {
					if start == "indexed" {
						if err := os.Rename(index, index+".away"); err != nil {
							b.Fatal(err)
						}
					}
					r := paired.Compare(b, paired.Runs, distribution, kiln)
					if start == "indexed" {
						if err := os.Rename(index+".away", index); err != nil {
							b.Fatal(err)
						}
					}
					paired.Report(b, "kiln-"+start+"/dist", r)
					b.ReportMetric(float64(paired.MedianDuration(r.Candidate).Microseconds())/1000, "kiln-"+start+"-ms")
					b.ReportMetric(float64(paired.MedianDuration(r.Baseline).Microseconds())/1000, "dist-"+start+"-ms")
					b.Logf("%d images: kiln (%s) %v, distribution %v (medians); kiln/dist %s; load average %s",
						n, start, paired.MedianDuration(r.Candidate), paired.MedianDuration(r.Baseline), r, paired.LoadAverage())
				}
			}
		})
	}
}

// servesFromIndex checks that kiln-agent serve, started on the layout with
// its prebuilt index, serves the first and last image's manifests by tag
// (read on request), so the "prebuilt" figures time a working start.
func servesFromIndex(b *testing.B, agent, oci string, imgs []images.RandomImage) {
	b.Helper()
	addr := freePort(b)
	cmd := exec.Command(agent, "serve", "--listen", addr, oci)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	startToReadyWait(b, addr)
	for _, img := range []images.RandomImage{imgs[0], imgs[len(imgs)-1]} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v2/"+repoOf(img.Ref)+"/manifests/"+tagOf(img.Ref), nil)
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") != img.Digest {
			b.Fatalf("%s from the prebuilt index: %s, digest %q, want %s", img.Ref, resp.Status, resp.Header.Get("Docker-Content-Digest"), img.Digest)
		}
	}
	if !strings.Contains(log.String(), "index prebuilt by the factory") {
		b.Fatalf("kiln-agent serve did not start from the prebuilt index:\n%s", log.String())
	}
}

// startToReady starts a registry and returns the time until GET /v2/ first
// answers 200; the process is stopped before returning.
func startToReady(b *testing.B, addr, bin string, args ...string) time.Duration {
	b.Helper()
	cmd := exec.Command(bin, args...)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	client := &http.Client{Timeout: time.Second}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	for deadline := start.Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Microsecond) {
		resp, err := client.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start)
			}
		}
	}
	b.Fatalf("%s never answered /v2/ 200 within 60 s:\n%s", bin, log.String())
	return 0
}

// fillDistribution writes every image of the layout into distribution's
// filesystem storage under dir, as a push would leave it (blobs hard-linked
// from the layout, the repository's link files), and returns that storage
// root. Pushing 2,000 images took most of the benchmark's 9 minutes; this
// takes a second. Distribution then serves a sample of the images, checked
// by pulling them (every blob re-hashed), so a wrong fill fails here.
func fillDistribution(b *testing.B, dist, dir, oci string, imgs []images.RandomImage) string {
	b.Helper()
	root := filepath.Join(dir, "distribution")
	v2 := filepath.Join(root, "docker", "registry", "v2")
	link := func(path, digest string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(digest), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for _, img := range imgs {
		ref, err := name.ParseReference(img.Ref)
		if err != nil {
			b.Fatal(err)
		}
		// Served as ADDR/bench.local/img-N: the whole reference is the path.
		repo := filepath.Join(v2, "repositories", ref.Context().RegistryStr(), ref.Context().RepositoryStr())
		h, _ := v1.NewHash(img.Digest)
		// Read directly: the layout package parses index.json per image.
		f, err := os.Open(filepath.Join(oci, "blobs", "sha256", h.Hex))
		if err != nil {
			b.Fatal(err)
		}
		mf, err := v1.ParseManifest(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		distBlob(b, v2, oci, h)
		link(filepath.Join(repo, "_manifests", "revisions", "sha256", h.Hex, "link"), h.String())
		tag := filepath.Join(repo, "_manifests", "tags", ref.Identifier())
		link(filepath.Join(tag, "current", "link"), h.String())
		link(filepath.Join(tag, "index", "sha256", h.Hex, "link"), h.String())
		for _, d := range append([]v1.Descriptor{mf.Config}, mf.Layers...) {
			distBlob(b, v2, oci, d.Digest)
			link(filepath.Join(repo, "_layers", "sha256", d.Digest.Hex, "link"), d.Digest.String())
		}
	}

	addr := freePort(b)
	cmd := exec.Command(dist, "serve", distConfig(b, dir, root, addr))
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	startToReadyWait(b, addr)
	for _, img := range []images.RandomImage{imgs[0], imgs[len(imgs)/2], imgs[len(imgs)-1]} {
		ref, err := name.ParseReference(addr+"/"+img.Ref, name.Insecure)
		if err != nil {
			b.Fatal(err)
		}
		if err := pullAndCheck(ref, img.Digest); err != nil {
			b.Fatalf("distribution filled from %s does not serve %s: %v", oci, img.Ref, err)
		}
	}
	return root
}

// pullAndCheck pulls ref as a client does, checks every blob against its
// digest, and the manifest's digest against want.
func pullAndCheck(ref name.Reference, want string) error {
	im, err := remote.Image(ref)
	if err != nil {
		return err
	}
	if d, err := im.Digest(); err != nil || d.String() != want {
		return fmt.Errorf("manifest digest %s (%v), want %s", d, err, want)
	}
	// validate.Image would gunzip these uncompressed layers: hash them here.
	cfg, err := im.RawConfigFile()
	if err != nil {
		return err
	}
	if h, _, _ := v1.SHA256(bytes.NewReader(cfg)); h != must(im.ConfigName()) {
		return fmt.Errorf("config has digest %s, want %s", h, must(im.ConfigName()))
	}
	ls, err := im.Layers()
	if err != nil {
		return err
	}
	for _, l := range ls {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		h, _, err := v1.SHA256(rc)
		rc.Close()
		if want, _ := l.Digest(); err != nil || h != want {
			return fmt.Errorf("layer %s read back as %s (%v)", want, h, err)
		}
	}
	return nil
}

func must[T any](v T, _ error) T { return v }

// distBlob hard-links blob h of the layout into distribution's blob store.
func distBlob(b *testing.B, v2, oci string, h v1.Hash) {
	b.Helper()
	dst := filepath.Join(v2, "blobs", "sha256", h.Hex[:2], h.Hex, "data")
	if _, err := os.Stat(dst); err == nil {
		return // shared
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Link(filepath.Join(oci, "blobs", "sha256", h.Hex), dst); err != nil {
		b.Fatal(err)
	}
}

// startToReadyWait waits until the registry at addr answers /v2/ with 200.
func startToReadyWait(b testing.TB, addr string) {
	b.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
	}
	b.Fatalf("the registry at %s never answered /v2/", addr)
}

// distConfig writes a distribution config: filesystem storage at root,
// loopback only, quiet.
func distConfig(b *testing.B, dir, root, addr string) string {
	b.Helper()
	path := filepath.Join(dir, "config-"+strings.ReplaceAll(addr, ":", "-")+".yml")
	text := fmt.Sprintf("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: false\nhttp:\n  addr: %s\n", root, addr)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}

// freePort is a loopback address with a free port.
func freePort(b testing.TB) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
