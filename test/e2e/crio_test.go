//go:build e2e

package e2e

// CRI-O on the appliance (issue 11): the workload pod, started through the
// CRI by a unit on the node, and the CRI client (test/crio/cmd/cri-check)
// that starts it and checks what CRI-O reports.

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
)

const (
	// workloadPod is the CRI pod name of the appliance's workload.
	workloadPod = "hello"
	// criCheckPath is where the CRI client lands in the guest.
	criCheckPath = "/usr/local/bin/cri-check"
	workloadUnit = "kiln-e2e-workload.service"
)

// workloadUnitText starts the appliance's workload through the CRI, as a
// node agent would: after CRI-O, from the preloaded image, never pulling.
// Its console output says what it started or why not.
var workloadUnitText = workloadUnitFor(helloRef, "")

// workloadUnitFor is the workload unit running image; env, if set, is an
// EnvironmentFile= line the image may come from (${IMAGE}).
func workloadUnitFor(image, env string) string {
	return `[Unit]
Description=kiln e2e appliance workload (pod ` + workloadPod + ` via the CRI)
# Wants, not Requires: after an unclean shutdown CRI-O's first start can
# fail (its wipe of its store fails) and systemd restarts it; a Requires=
# would fail this unit for good on that first failure. kiln puts back the
# images CRI-O lost before a workload that is neither a kubelet pod nor a
# health unit of the release starts: such a workload orders itself after
# the restore, which waits for CRI-O to be up (docs/units.md).
Wants=crio.service
After=crio.service kiln-restore-images.service

[Service]
Type=oneshot
RemainAfterExit=yes
StandardOutput=journal+console
StandardError=journal+console
` + env + `ExecStart=` + criCheckPath + ` -timeout 4m run ` + workloadPod + ` ` + image + ` -sleep

[Install]
WantedBy=multi-user.target
`
}

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

// addCRIWorkload adds the CRI client (gzip in the config: 13 MB static
// binary, ~5 MB compressed), the pause-image drop-in and the workload unit.
func addCRIWorkload(t *testing.T, cfg *types.Config, criCheck string) {
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
	yes := true
	unit := workloadUnitText
	cfg.Storage.Files = append(cfg.Storage.Files,
		types.File{Node: types.Node{Path: criCheckPath},
			FileEmbedded1: types.FileEmbedded1{Mode: &exe, Contents: types.Resource{Source: &src, Compression: &gzName}}},
		types.File{Node: types.Node{Path: "/etc/crio/crio.conf.d/40-kiln-e2e-pause.conf"},
			FileEmbedded1: types.FileEmbedded1{Mode: &conf, Contents: types.Resource{Source: guest.DataURL(pauseDropIn)}}},
	)
	cfg.Systemd.Units = append(cfg.Systemd.Units, types.Unit{Name: workloadUnit, Enabled: &yes, Contents: &unit})
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
	t.Parallel() // beside the other machines (the Makefile runs three at a time)
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
