package main

import (
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
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/paired"
)

// BenchmarkServeStartup: from exec to the first 200 on GET /v2/, for the
// node's registry (kiln-agent serve, which indexes and checks every manifest
// before it listens) and for the reference registry, distribution 2.8
// (Debian's docker-registry, which reads nothing at start), holding the same
// 2, 200 and 2,000 images. Both are polled the same way; runs are paired and
// the ratio kiln/distribution is reported as median and range.
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
			imgs, err := images.RandomImages(oci, n, int64(n)*4096, 0.3, 1)
			if err != nil {
				b.Fatal(err)
			}
			distRoot := fillDistribution(b, dist, dir, oci, imgs)
			kiln := func() time.Duration {
				addr := freePort(b)
				return startToReady(b, addr, agent, "serve", "--listen", addr, oci)
			}
			distribution := func() time.Duration {
				addr := freePort(b)
				return startToReady(b, addr, dist, "serve", distConfig(b, dir, distRoot, addr))
			}
			for i := 0; i < b.N; i++ {
				r := paired.Compare(b, paired.Runs, distribution, kiln)
				paired.Report(b, "kiln/dist", r)
				b.ReportMetric(float64(paired.MedianDuration(r.Candidate).Microseconds())/1000, "kiln-ms")
				b.ReportMetric(float64(paired.MedianDuration(r.Baseline).Microseconds())/1000, "dist-ms")
				b.Logf("%d images: kiln %v, distribution %v (medians); kiln/dist %s",
					n, paired.MedianDuration(r.Candidate), paired.MedianDuration(r.Baseline), r)
			}
		})
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

// fillDistribution pushes every image of the layout into a distribution
// registry whose storage is under dir, and returns that storage root.
func fillDistribution(b *testing.B, dist, dir, oci string, imgs []images.RandomImage) string {
	b.Helper()
	root := filepath.Join(dir, "distribution")
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
	p, err := layout.FromPath(oci)
	if err != nil {
		b.Fatal(err)
	}
	for _, img := range imgs {
		h, err := v1.NewHash(img.Digest)
		if err != nil {
			b.Fatal(err)
		}
		im, err := p.Image(h)
		if err != nil {
			b.Fatal(err)
		}
		ref, err := name.ParseReference(addr+"/"+img.Ref, name.Insecure)
		if err != nil {
			b.Fatal(err)
		}
		if err := remote.Write(ref, im); err != nil {
			b.Fatalf("push %s to distribution: %v", img.Ref, err)
		}
	}
	return root
}

func startToReadyWait(b *testing.B, addr string) {
	b.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
	}
	b.Fatalf("distribution at %s never answered", addr)
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
