//go:build e2e

package e2e

// CRI-O and the kubelet on the appliance (issues 11, 24): the workload is a
// static pod the release ships in /etc/kubernetes/manifests, which the
// kubelet runs through CRI-O; the CRI client (test/crio/cmd/cri-check)
// checks what CRI-O reports and is the release's health check of the pod.

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coreos/ignition/v2/config/v3_3/types"

	"github.com/kiln-appliance/kiln/test/e2e/guest"
	"github.com/kiln-appliance/kiln/test/e2e/repo"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

const (
	// workloadPod is the static pod of the appliance's workload (the
	// kubelet runs it as hello-<node name>, in namespace kiln-e2e).
	workloadPod = "hello"
	// criCheckPath is where the CRI client lands in the guest.
	criCheckPath = "/usr/local/bin/cri-check"
	// manifestDir is the kubelet's staticPodPath on the e2e base, and one
	// of kiln's release directories: a release ships its pods there.
	manifestDir = "/etc/kubernetes/manifests"
	// workloadManifest is the workload pod's manifest on the node.
	workloadManifest = manifestDir + "/" + workloadPod + ".yaml"
	// kubeletUnit runs the static pods: the health check's unit.
	kubeletUnit = "kubelet.service"
)

// podManifest is a static pod running image with one container that prints
// its hello line and sleeps until SIGTERM. imagePullPolicy Never: the
// appliance's upstreams are dead, every image it runs is on the node (a
// served-only image is pulled through kiln's mirror before its pod is
// created), and a pod whose image is missing must fail, not pull.
func podManifest(pod, image string) string {
	return `# kiln e2e: a static pod (the kubelet reads ` + manifestDir + `).
apiVersion: v1
kind: Pod
metadata:
  name: ` + pod + `
  namespace: kiln-e2e
spec:
  # The image's program exits on SIGTERM at once.
  terminationGracePeriodSeconds: 10
  # The node has no cluster DNS.
  dnsPolicy: Default
  containers:
    - name: ` + pod + `
      image: ` + image + `
      imagePullPolicy: Never
      args: ["-sleep"]
`
}

// podHealth is a release's health check of the workload pod (the recipe's
// upgrade.health.command, podHealthPath): ready, its container running.
// Once the scenario script has checked the release being tried (it creates
// triedMark), a pod that can never start (an image of the release's pod
// manifest neither in CRI-O's storage nor to be pulled) makes it exit
// podUnavailableExit, which the upgrade scenarios' recipes make final
// (upgrade.health.unhealthyExitCode): the release is rolled back at once,
// after the checks, instead of at the timeout. podHealthLine is how the
// console spells it.
const (
	podHealthPath      = "/usr/local/bin/kiln-e2e-health"
	triedMark          = "/run/kiln-e2e-tried"
	podUnavailableExit = 3
	podHealth          = "[" + podHealthPath + "]"
	podHealthLine      = podHealthPath
	podHealthScript    = `#!/bin/bash
# The e2e workload's health check (upgrade.health.command).
args=(-timeout 20s)
if [ -e ` + triedMark + ` ]; then args+=(-manifest ` + workloadManifest + ` -unavailable-exit 3); fi
exec ` + criCheckPath + ` "${args[@]}" ready ` + workloadPod + `
`
)

// pauseDropIn: CRI-O creates every pod's sandbox from its pause image (it
// runs no infra container, drop_infra_ctr, but the image must be there). An
// offline appliance must have it preloaded: here, the preloaded hello image.
const pauseDropIn = `# kiln e2e: the pause image is one of the appliance's preloaded images.
[crio.image]
pause_image = "` + helloRef + `"
`

// buildCRICheck builds the CRI client static, from its own module (test/crio).
func buildCRICheck(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "cri-check")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./cmd/cri-check")
	cmd.Dir = filepath.Join(repo.Root(), "test", "crio")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build test/crio/cmd/cri-check: %v\n%s", err, msg)
	}
	return out
}

// addCRIClient adds the CRI client (gzip in the config: 13 MB static
// binary, ~5 MB compressed) and the pause-image drop-in naming pause.
func addCRIClient(t *testing.T, cfg *types.Config, criCheck, pause string) {
	t.Helper()
	bin, err := os.ReadFile(criCheck)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	w, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	w.Write(bin)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	src := "data:;base64," + base64.StdEncoding.EncodeToString(gz.Bytes())
	gzName, exe, conf := "gzip", 0o755, 0o644
	cfg.Storage.Files = append(cfg.Storage.Files,
		types.File{Node: types.Node{Path: criCheckPath},
			FileEmbedded1: types.FileEmbedded1{Mode: &exe, Contents: types.Resource{Source: &src, Compression: &gzName}}},
		types.File{Node: types.Node{Path: podHealthPath},
			FileEmbedded1: types.FileEmbedded1{Mode: &exe, Contents: types.Resource{Source: guest.DataURL(podHealthScript)}}},
		types.File{Node: types.Node{Path: "/etc/crio/crio.conf.d/40-kiln-e2e-pause.conf"},
			FileEmbedded1: types.FileEmbedded1{Mode: &conf, Contents: types.Resource{Source: guest.DataURL(strings.Replace(pauseDropIn, helloRef, pause, 1))}}},
	)
}

// addWorkloadPod adds the workload's static pod manifest running image: the
// factory release's pod (kiln records the files Ignition wrote in its
// release directories as the factory release's).
func addWorkloadPod(cfg *types.Config, image string) {
	mode := 0o644
	cfg.Storage.Files = append(cfg.Storage.Files, types.File{Node: types.Node{Path: workloadManifest},
		FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: guest.DataURL(podManifest(workloadPod, image))}}})
}

type applianceOptions struct{ copyMode, powerCut bool }

type applianceOption func(*applianceOptions)

// withCopyMode builds the appliance with preload.mode: copy.
func withCopyMode() applianceOption { return func(o *applianceOptions) { o.copyMode = true } }

// withPowerCut has the first boot's check script end by asking for the
// power cut (bootWithPowerCut presses reset) instead of powering off.
func withPowerCut() applianceOption { return func(o *applianceOptions) { o.powerCut = true } }

func (o applianceOptions) powerCutWord() string {
	if o.powerCut {
		return "yes"
	}
	return "no"
}

func (o applianceOptions) preloadMode() string {
	if o.copyMode {
		return "copy"
	}
	return "store"
}

// TestApplianceCopyMode: with preload.mode copy, kiln-preload-copy.service
// copies the preloaded images into the node's main store before CRI-O
// starts; CRI-O lists them pinned with the locked digests and the workload
// runs from them, with no pull. The first boot makes the same checks as
// TestApplianceBoots' first boot; then the power is cut, and in copy mode
// every image is in CRI-O's writable store, so the next boot must restore
// what CRI-O lost (the preloaded-only image from the partition's preloaded
// store, the others from its OCI layout) before the workload starts.
func TestApplianceCopyMode(t *testing.T) {
	vm.Schedule(t, 7*time.Minute)
	a := buildAppliance(t, applianceBootCheck, withCopyMode(), withPowerCut())
	run, first, second := bootWithPowerCut(t, a.disk, "copy-mode", applianceTimeout(24*time.Minute))
	readJournal(t, mustFind(t, a.disk, "root"), filepath.Join(filepath.Dir(run.Console), "copy-mode-journal.txt"))
	requireAllPass(t, run)
	if c, ok := first.Check("crio-after-mount"); !ok || !strings.HasSuffix(c.Detail, "mode=copy") {
		t.Errorf("crio-after-mount: %+v, want a detail ending mode=copy", c)
	}
	for _, name := range []string{
		"image-hello", "image-preloaded", "crio-after-mount", "cri-image-hello", "cri-image-preloaded",
		"workload-up", "cri-workload", "workload-no-pull", "cri-pull-served", "cri-image-served", "firstboot-done", "served-pod-up",
	} {
		requirePass(t, first, name)
	}
	for _, name := range []string{
		"crio-unclean", "restore", "status-images", "image-hello", "image-preloaded", "image-served", "cri-workload", "workload-no-pull", "served-pod-up",
	} {
		requirePass(t, second, name)
	}
	for _, ref := range []string{helloRef, preloadedRef, servedRef} {
		requireRestored(t, run, second, "crio-unclean", ref, a.digests[ref])
	}
}
