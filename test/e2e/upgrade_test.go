//go:build e2e

package e2e

// The field upgrade (issue 13), on one machine that runs from the factory
// release through three sticks: QEMU hot-plugs each stick through its
// monitor when the guest asks, pulls it out when the console says it may be
// removed, and the guest reboots inside the same QEMU run.

import (
	"crypto/sha256"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/systemd/agent/release"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/test/e2e/fixture"
	"github.com/kiln-appliance/kiln/test/e2e/guest"
	"github.com/kiln-appliance/kiln/test/e2e/rawdisk"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
	"github.com/kiln-appliance/kiln/test/fixtures/images"

	"github.com/coreos/ignition/v2/config/v3_3/types"
)

//go:embed testdata/upgrade-check.sh
var upgradeCheck string

//go:embed testdata/upgrade-refusals.sh
var upgradeRefusals string

//go:embed testdata/upgrade-lib.sh
var upgradeLib string

const (
	pauseRef = "quay.io/kiln-e2e/pause:1"   // CRI-O's pause image, in every release
	appRepo  = "quay.io/kiln-e2e/app"       // the workload: app:1.0, app:1.1, app:1.2
	toolsRef = "quay.io/kiln-e2e/tools:1.3" // only 1.3 carries it
)

// upgradeRelease is one release of the scenario's appliance.
type upgradeRelease struct {
	version string
	images  []string // preloaded (and served) images
	app     string   // the image the workload pod's manifest names (a release file)
	trust   []string // names of the keys (NAME.pub in the set's dir) the node trusts once it is current
	key     string   // the key (NAME.key) its stick is signed with
}

// TestFieldUpgrade: factory 1.0 boots; the 1.1 delta stick is hot-plugged,
// imported, pulled out; the reboot tries 1.1 (begun before CRI-O), the
// health check confirms it, the workload runs 1.1's image, 1.1 and 1.0 are
// pinned. 1.2 (delta from 1.1): confirmed, 1.0 unpinned and its stored
// blobs gone. 1.3 (delta from 1.2) names a workload image it does not
// carry: the health check rolls it back to 1.2, 1.3's image and blobs are
// removed. Five boots of one QEMU process.
func TestFieldUpgrade(t *testing.T) {
	vm.Schedule(t, 17*time.Minute)
	set := newUpgradeSet(t, upgradeCheck)
	// A 1.3 signed by the factory key, which 1.2 retired: a full bundle from
	// a recipe that still trusts it (kiln bundle signs only for nodes that
	// trust the key, and this recipe says they do).
	r13, err := os.ReadFile(set.recipes["1.3.0"])
	if err != nil {
		t.Fatal(err)
	}
	set.recipes["1.3.0-retired"] = filepath.Join(filepath.Dir(set.recipes["1.3.0"]), "retired.yaml")
	retired := regexp.MustCompile(`(?m)^trust: .*$`).ReplaceAllString(string(r13), "trust: ["+filepath.Join(set.dir, "factory.pub")+"]")
	if err := os.WriteFile(set.recipes["1.3.0-retired"], []byte(retired), 0o644); err != nil {
		t.Fatal(err)
	}
	set.bundle(t, "retired", "1.3.0-retired", "--key", filepath.Join(set.dir, "factory.key"))
	tech := &technician{t: t, sticks: set.sticks}
	res := vm.Boot(t, set.disk, append(tech.hands(), vm.WithName("field-upgrade"), vm.WithReboots(),
		vm.WithTimeout(applianceTimeout(40*time.Minute)))...)
	plugs, disk, digests := tech.plugs, set.disk, set.digests
	t.Logf("field upgrade: %s in one QEMU run", res.Duration.Round(time.Second))
	logUpgradeTimes(t, res)
	root := mustFind(t, disk, "root")
	readJournal(t, root, filepath.Join(filepath.Dir(res.Console), "field-upgrade-journal.txt"))

	final, b := finalState(t, root)
	if final.Current.Version != "1.2.0" || final.Previous == nil || final.Previous.Version != "1.1.0" ||
		final.Staged != nil || final.Trying != nil || len(final.Retired) > 0 ||
		final.Last == nil || final.Last.Action != "rollback" || final.Last.Version != "1.3.0" {
		t.Errorf("final %s:\n%s", contract.StateFile, b)
	}

	requireAllPass(t, res)
	if strings.Join(plugs, " ") != "1.1.0 1.2.0 retired 1.3.0" {
		t.Errorf("sticks plugged: %v, want 1.1.0 1.2.0 retired 1.3.0", plugs)
	}
	for _, name := range []string{
		"b1-settled", "b1-current", "b1-cri-workload", "b1-pause-pinned", "b1-app-1.0-pinned", "b1-trust", "b1-staged", "b1-stick-removed",
		"b2-begin-before-crio", "b2-mirror-opened", "b2-current", "b2-previous", "b2-cri-workload", "b2-app-1.1-pinned", "b2-app-1.0-pinned", "b2-pins-file", "b2-trust", "b2-staged", "b2-stick-removed",
		"b3-begin-before-crio", "b3-mirror-opened", "b3-current", "b3-cri-workload", "b3-app-1.2-pinned", "b3-app-1.1-pinned", "b3-app-1.0-unpinned", "b3-pod-1.0-blob-gone", "b3-trust",
		"b3-retired-refused", "b3-retired-unchanged", "b3-staged",
		"b4-begin-before-crio", "b4-tools-loaded", "b4-workload-failed",
		"b5-current", "b5-rolled-back", "b5-files-restored", "b5-cri-workload", "b5-app-1.2-pinned", "b5-app-1.1-pinned", "b5-tools-removed", "b5-tools-blob-gone", "b5-trust",
	} {
		requirePass(t, res, name)
	}

	// What the technician reads on the console, for each stick.
	for _, v := range []string{"1.1.0", "1.2.0", "1.3.0"} {
		for _, want := range []string{
			"release " + v + " is staged; the stick may be removed now",
		} {
			if _, ok := res.When(want); !ok {
				t.Errorf("console lacks %q", want)
			}
		}
	}
	for _, want := range []string{
		"signed by SHA256:", "kiln: the new release is staged; reboot the appliance (systemctl reboot) to try it",
		"refused: not signed by a trusted key", // the retired key, after 1.2's rotation
		"health check of release 1.1.0: kubelet.service active and \"" + podHealthLine + "\" exits 0 (exit 3: unhealthy for good, roll back at once), within " + podHealthTimeout.String(),
		"release 1.1.0 passed its health check and is now current", "release 1.2.0 passed its health check and is now current",
		// 1.3's pod can never start (its image is on no stick): once the
		// script checked it, podHealth says so, and the node rolls back at
		// once, not at the timeout.
		"kiln: release 1.3.0 failed its health check: command " + podHealthLine + " said unhealthy (exit status 3): cri-check: pod " + workloadPod + " can never start: image " + appRepo + ":1.3 ", "; rolled back to 1.2.0",
	} {
		if _, ok := res.When(want); !ok {
			t.Errorf("console lacks %q", want)
		}
	}

	// The state each boot ended with, as kiln agent status -o json says.
	st := upgradeStatuses(t, res)
	want := []struct{ current, previous, staged, lastAction, lastVersion string }{
		{"1.0.0", "", "1.1.0", "stage", "1.1.0"},
		{"1.1.0", "1.0.0", "1.2.0", "stage", "1.2.0"},
		{"1.2.0", "1.1.0", "1.3.0", "stage", "1.3.0"},
		{"1.2.0", "1.1.0", "", "rollback", "1.3.0"}, // boot 5: boot 4 is cut off by the rollback's reboot
	}
	for i, w := range want {
		n := i + 1
		if n == 4 {
			n = 5
		}
		s, ok := st[n]
		if !ok {
			t.Errorf("boot %d printed no status", n)
			continue
		}
		got := struct{ current, previous, staged, lastAction, lastVersion string }{current: s.Current.Version}
		if s.Previous != nil {
			got.previous = s.Previous.Version
		}
		if s.Staged != nil {
			got.staged = s.Staged.Version
		}
		if s.Last != nil {
			got.lastAction, got.lastVersion = s.Last.Action, s.Last.Version
		}
		if got != w {
			t.Errorf("boot %d status: %+v, want %+v", n, got, w)
		}
		if s.Trying != nil || len(s.Retired) > 0 || !s.PinsCurrent {
			t.Errorf("boot %d status not at rest: trying %v, retired %v, pins current %v", n, s.Trying, s.Retired, s.PinsCurrent)
		}
	}
	if s, ok := st[5]; ok {
		if s.Last == nil || s.Last.OK || !strings.Contains(s.Last.Message, podHealthLine) {
			t.Errorf("boot 5: last result %+v, want a failed rollback naming the pod's health check", s.Last)
		}
		for _, p := range s.Pins {
			if strings.Contains(p, digests[toolsRef]) || strings.Contains(p, digests[appRepo+":1.0"]) {
				t.Errorf("boot 5 still pins %s", p)
			}
		}
	}
}

// finalState is the release state the node ended with, read off its disk,
// and its bytes (for a failure message).
func finalState(t *testing.T, root rawdisk.Partition) (*state.State, []byte) {
	t.Helper()
	b, err := root.ReadFile(contract.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	var s state.State
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", contract.StateFile, err)
	}
	return &s, b
}

// upgradeSet is what the upgrade scenarios boot and plug: the factory disk
// of release 1.0.0 and a stick image per later release, built by the real
// kiln, and the digests the guest checks against.
type upgradeSet struct {
	dir, kiln, disk string
	recipes         map[string]string // version -> recipe path
	sticks          map[string]string // what the guest asks for -> stick image
	digests         map[string]string // image ref -> manifest digest
}

// podHealthTimeout bounds the pod health check of the upgrade scenarios'
// releases. A release that passes does so as soon as its pod is ready (34 s
// after the check began, on a busy machine, for the first upgrade boot: the
// kubelet starts the pod on a new image); 45 s was too little on a CI
// machine under more load, and a good 1.1 was rolled back. Only a release
// meant to fail (1.3 in TestFieldUpgrade) waits it out.
const podHealthTimeout = 3 * time.Minute

// upgradeOptions are what the recipes of a set share beyond their release.
type upgradeOptions struct {
	// The recipes' upgrade.health, the node's health check of every later
	// release (the factory build's is the node's): units [kubelet.service]
	// and command, within timeout.
	command string        // YAML flow list, e.g. [/usr/bin/test, -e, /run/x]; default podHealth
	timeout time.Duration // default podHealthTimeout
	// waitOutBroken leaves out upgrade.health.unhealthyExitCode: a release
	// whose pod can never start is rolled back only at the timeout, not as
	// soon as podHealth says so (TestImageGC keeps it running meanwhile).
	waitOutBroken bool
	// copyMode builds with preload.mode copy: the factory's images in
	// CRI-O's writable store, where a collector could remove them.
	copyMode bool
	// releases replaces upgradeReleases(); bases gives a release's recipe
	// its base (default: fixture.Base).
	releases []upgradeRelease
	bases    map[string]string
	// script fills in the scenario script's own @…@ values.
	script map[string]string
	// from names the release whose stick a release's stick is a delta from
	// (default: the release before it).
	from map[string]string
	// agents gives a release a kiln-agent of its own, stamped with this
	// version (default: the factory build's, beside kiln).
	agents map[string]string
	// secureBoot makes the set's Secure Boot keys (kiln key secureboot),
	// names them in every recipe's secureBoot, and builds the factory disk
	// and the sticks with --secure-boot-key: its releases boot as db-signed
	// unified kernel images. The bases must be A/B bases.
	secureBoot bool
}

// finalExit is the recipe's upgrade.health.unhealthyExitCode line: podHealth
// says at once when a release's pod can never start.
func (o upgradeOptions) finalExit() string {
	if o.command != podHealth || o.waitOutBroken {
		return ""
	}
	return fmt.Sprintf("    unhealthyExitCode: %d\n", podUnavailableExit)
}

func (o upgradeOptions) preloadMode() string {
	if o.copyMode {
		return "copy"
	}
	return "store"
}

// newUpgradeSet builds the releases of upgradeReleases with checkScript (its
// @…@ values filled in) as the guest's scenario script.
func newUpgradeSet(t *testing.T, checkScript string, options ...upgradeOptions) *upgradeSet {
	t.Helper()
	base := fixture.Base(t)
	dir := t.TempDir()
	set := &upgradeSet{dir: dir, kiln: buildKilnBinary(t, dir), disk: filepath.Join(dir, "appliance.raw"),
		recipes: map[string]string{}, sticks: map[string]string{}, digests: map[string]string{}}
	layout := filepath.Join(dir, "oci")
	mustKilnCmd(t, set.kiln, "key", "generate", filepath.Join(dir, "factory"))
	mustKilnCmd(t, set.kiln, "key", "generate", filepath.Join(dir, "rotated"))

	for _, ref := range []string{pauseRef, appRepo + ":1.0", appRepo + ":1.1", appRepo + ":1.2", toolsRef} {
		d, err := images.HelloImage(layout, ref, "amd64")
		if err != nil {
			t.Fatal(err)
		}
		// Each later release brings a layer of its own, so its stick
		// carries blobs the node must copy and load.
		if ref != pauseRef && ref != appRepo+":1.0" {
			if d, err = addOwnLayer(layout, ref, d); err != nil {
				t.Fatal(err)
			}
		}
		set.digests[ref] = d
	}
	_, _, toolsLayers, err := images.Blobs(layout, toolsRef)
	if err != nil {
		t.Fatal(err)
	}
	h := upgradeOptions{}
	if len(options) > 0 {
		h = options[0]
	}
	var sbKey []string
	if h.secureBoot {
		mustKilnCmd(t, set.kiln, "key", "secureboot", filepath.Join(dir, "sb"))
		sbKey = []string{"--secure-boot-key", filepath.Join(dir, "sb", "db.key")}
	}
	rels := upgradeReleases()
	if h.releases != nil {
		rels = h.releases
	}
	trustFile := func(name string) string {
		pem, err := os.ReadFile(filepath.Join(dir, name+".pub"))
		if err != nil {
			t.Fatal(err)
		}
		return contract.TrustFileName(pem)
	}
	script := strings.NewReplacer(
		"@TRUST_FACTORY@", trustFile("factory"), "@TRUST_ROTATED@", trustFile("rotated"),
		"@WORKLOAD_POD@", workloadPod, "@HELLO_LINE@", images.HelloLine("amd64"), "@APP_REPO@", appRepo,
		"@PAUSE_REF@", pauseRef, "@PAUSE_DIGEST@", set.digests[pauseRef],
		"@APP10_DIGEST@", set.digests[appRepo+":1.0"], "@APP11_DIGEST@", set.digests[appRepo+":1.1"], "@APP12_DIGEST@", set.digests[appRepo+":1.2"],
		"@TOOLS_REF@", toolsRef, "@TOOLS_DIGEST@", set.digests[toolsRef], "@TOOLS_LAYER@", toolsLayers[len(toolsLayers)-1],
		"@POD10_BLOB@", fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(podManifest(workloadPod, rels[0].app)))),
	).Replace(strings.Replace(withLib(checkScript), "#@UPGRADE_LIB@\n", upgradeLib, 1))
	for k, v := range h.script {
		script = strings.ReplaceAll(script, "@"+k+"@", v)
	}
	writeUpgradeFragment(t, dir, script)

	if h.command == "" {
		h.command = podHealth
	}
	if h.timeout == 0 {
		h.timeout = podHealthTimeout
	}
	for _, r := range rels {
		b := base
		if p, ok := h.bases[r.version]; ok {
			b = p
		}
		set.recipes[r.version] = writeUpgradeRecipe(t, dir, b, r, h)
	}
	start := time.Now()
	cmd := exec.Command(set.kiln, append([]string{"build", set.recipes["1.0.0"], "-o", set.disk, "--cache", filepath.Join(dir, "cache")}, sbKey...)...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kiln build 1.0.0: %v\n%s", err, out)
	}
	// Each stick a delta from the release before it, as a vendor ships them,
	// signed by a key the release before it trusts.
	from := set.disk
	for _, r := range rels[1:] {
		if v, ok := h.from[r.version]; ok {
			from = set.sticks[v]
		}
		args := append([]string{"--key", filepath.Join(dir, r.key+".key"), "--from", from}, sbKey...)
		if v, ok := h.agents[r.version]; ok {
			args = append(args, "--agent", buildAgent(t, filepath.Join(dir, "kiln-agent-"+v), v))
		}
		set.bundle(t, r.version, r.version, args...)
		from = set.sticks[r.version]
	}
	t.Logf("kiln build of 1.0.0 and bundles of the later releases took %s", time.Since(start).Round(time.Second))
	return set
}

// bundle locks release version's recipe and writes its stick image as
// set.sticks[name] with kiln bundle ARGS.
func (set *upgradeSet) bundle(t *testing.T, name, version string, args ...string) {
	t.Helper()
	mustKilnCmd(t, set.kiln, "lock", set.recipes[version])
	set.sticks[name] = filepath.Join(set.dir, "stick-"+name+".img")
	mustKilnCmd(t, set.kiln, append([]string{"bundle", set.recipes[version], "-o", set.sticks[name]}, args...)...)
}

func upgradeReleases() []upgradeRelease {
	// Keys rotate: 1.1 (signed by the factory key) trusts a new key beside
	// it; 1.2 (signed by the new key, which the node trusts once 1.1 is
	// confirmed) retires the factory key.
	return []upgradeRelease{
		{"1.0.0", []string{pauseRef, appRepo + ":1.0"}, appRepo + ":1.0", []string{"factory"}, ""},
		{"1.1.0", []string{pauseRef, appRepo + ":1.1"}, appRepo + ":1.1", []string{"factory", "rotated"}, "factory"},
		{"1.2.0", []string{pauseRef, appRepo + ":1.2"}, appRepo + ":1.2", []string{"rotated"}, "rotated"},
		// A broken release: its workload names an image it does not carry;
		// the factory key it would trust again never is (it is rolled back).
		{"1.3.0", []string{pauseRef, toolsRef}, appRepo + ":1.3", []string{"rotated", "factory"}, "rotated"},
	}
}

// technician is the test's hands at the running node: it plugs the stick
// the guest asks for ("kiln-e2e: plug NAME") and pulls it out when the
// console says it may be removed, or that it was refused.
type technician struct {
	t       *testing.T
	sticks  map[string]string
	plugged string   // the stick in the node, if any
	plugs   []string // what was plugged, in order
}

func (h *technician) hands() []vm.Option {
	pull := func(m *vm.Monitor, line string) error {
		if h.plugged == "" {
			return nil // the same line again
		}
		h.t.Logf("pulling %s out", h.plugged)
		id := h.plugged
		h.plugged = ""
		return m.UnplugDisk(id)
	}
	return []vm.Option{
		vm.OnConsole("kiln-e2e: plug ", func(m *vm.Monitor, line string) error {
			name := strings.TrimSpace(line[strings.Index(line, "kiln-e2e: plug ")+len("kiln-e2e: plug "):])
			stick, ok := h.sticks[name]
			if !ok {
				return fmt.Errorf("the guest asks for stick %q, the test has %v", name, h.sticks)
			}
			if h.plugged != "" {
				return fmt.Errorf("the guest asks for stick %s while %s is still plugged", name, h.plugged)
			}
			h.plugged = "stick-" + name
			h.plugs = append(h.plugs, name)
			h.t.Logf("plugging the %s stick in", name)
			return m.PlugDisk(h.plugged, stick)
		}),
		vm.OnConsole("the stick may be removed now", pull),
		vm.OnConsole("kiln-import", func(m *vm.Monitor, line string) error {
			if strings.Contains(line, " refused: ") {
				return pull(m, line)
			}
			return nil
		}),
	}
}

// upgradeStatuses parses the "KILN-E2E-STATUS: n=N {json}" lines, by boot.
func upgradeStatuses(t *testing.T, r *vm.Result) map[int]release.Status {
	t.Helper()
	out := map[int]release.Status{}
	for _, l := range r.Lines("KILN-E2E-STATUS: ") {
		var n int
		rest := strings.TrimPrefix(l, "KILN-E2E-STATUS: ")
		if _, err := fmt.Sscanf(rest, "n=%d ", &n); err != nil {
			t.Errorf("bad status line %q: %v", l, err)
			continue
		}
		var s release.Status
		if err := json.Unmarshal([]byte(rest[strings.Index(rest, " ")+1:]), &s); err != nil {
			t.Errorf("boot %d: status is not JSON (%v): %s", n, err, l)
			continue
		}
		out[n] = s
	}
	return out
}

// logUpgradeTimes logs when each step happened (docs/e2e.md records them).
func logUpgradeTimes(t *testing.T, r *vm.Result) {
	for _, step := range []string{
		"b1-boot PASS", "kiln-e2e: plug 1.1.0", "release 1.1.0 is staged", "kiln-e2e: rebooting to try 1.1.0",
		"b2-boot PASS", "b2-settled", "kiln-e2e: plug 1.2.0", "release 1.2.0 is staged", "kiln-e2e: rebooting to try 1.2.0",
		"b3-boot PASS", "b3-settled", "kiln-e2e: plug 1.3.0", "release 1.3.0 is staged", "kiln-e2e: rebooting to try 1.3.0",
		"b4-boot PASS", "b4-workload-failed", "rolled back to 1.2.0", "b5-boot PASS", "b5-settled", "b5-tools-blob-gone",
	} {
		if d, ok := r.When(step); ok {
			t.Logf("step %-40q at %s", step, d.Round(time.Second))
		} else {
			t.Logf("step %-40q never came", step)
		}
	}
}

// writeUpgradeFragment writes check.ign: the scenario script, its unit, the
// CRI client and CRI-O's pause image (the workload's pod is a release file).
func writeUpgradeFragment(t *testing.T, dir, script string) {
	t.Helper()
	cfg := guest.ScenarioConfig(script)
	yes := true
	hosts := "127.0.0.1 localhost\n::1 localhost\n127.0.0.9 quay.io registry.example.com docker.io registry-1.docker.io\n"
	mode := 0o644
	cfg.Storage.Files = append(cfg.Storage.Files, types.File{
		Node:          types.Node{Path: "/etc/hosts", Overwrite: &yes},
		FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: guest.DataURL(hosts)}},
	})
	addCRIClient(t, &cfg, buildCRICheck(t, dir), pauseRef)
	frag, err := guest.Validate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "check.ign"), frag, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeUpgradeRecipe writes release r's recipe in a directory of its own
// (a release is a commit of the same recipe) and returns its path. The
// factory build uses 1.0's: its upgrade policy and health check are the
// node's for every later release.
func writeUpgradeRecipe(t *testing.T, dir, base string, r upgradeRelease, h upgradeOptions) string {
	t.Helper()
	rd := filepath.Join(dir, "release-"+r.version)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rd, "hello.yaml"), []byte(podManifest(workloadPod, r.app)), 0o644); err != nil {
		t.Fatal(err)
	}
	var trust []string
	for _, k := range r.trust {
		trust = append(trust, filepath.Join(dir, k+".pub"))
	}
	var imgs strings.Builder
	for _, ref := range r.images {
		fmt.Fprintf(&imgs, "  - name: %s\n    source: oci:%s:%[1]s\n    preload: true\n", ref, filepath.Join(dir, "oci"))
	}
	recipe := fmt.Sprintf(`apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: kiln-e2e-upgrade
version: %s
arch: amd64
base:
  path: %s
disk:
  size: fit
imagePartition:
  size: auto
images:
%sregistry:
  listen: 127.0.0.1:5050
preload:
  mode: %s
trust: [%s]
release:
  files:
    - path: %s
      source: hello.yaml
upgrade:
  reboot: command
  health:
    units: [%s]
    command: %s
    timeout: %s
%signition:
  fragments:
    - ../check.ign
`, r.version, base, imgs.String(), h.preloadMode(), strings.Join(trust, ", "), workloadManifest, kubeletUnit, h.command, h.timeout, h.finalExit())
	if h.secureBoot {
		recipe += "secureBoot:\n  keys: ../sb\n"
	}
	p := filepath.Join(rd, "appliance.yaml")
	if err := os.WriteFile(p, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustKilnCmd(t *testing.T, kiln string, args ...string) {
	t.Helper()
	cmd := exec.Command(kiln, args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kiln %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestFieldUpgradeRefusals: on a running factory 1.0 node, a tampered
// stick, a stick signed by a key the node does not trust and a downgrade
// are each refused on the console with what to do, and change nothing
// (state.json, the release store, the pins). Then the good 1.1 stick, and
// the machine is reset (QMP system_reset: a power cut) while its blobs are
// copied: the node comes back on 1.0, and with the stick still in, the
// import runs again at boot and stages 1.1. Two boots of one QEMU process.
func TestFieldUpgradeRefusals(t *testing.T) {
	vm.Schedule(t, 7*time.Minute)
	set := newUpgradeSet(t, upgradeRefusals)
	factoryKey := filepath.Join(set.dir, "factory.key")
	mustKilnCmd(t, set.kiln, "key", "generate", filepath.Join(set.dir, "other"))
	// kiln bundle refuses to sign with a key the target nodes do not trust:
	// the untrusted stick is 1.1 from a recipe that trusts the other key.
	r11, err := os.ReadFile(set.recipes["1.1.0"])
	if err != nil {
		t.Fatal(err)
	}
	set.recipes["1.1.0-other"] = filepath.Join(filepath.Dir(set.recipes["1.1.0"]), "other.yaml")
	if err := os.WriteFile(set.recipes["1.1.0-other"], []byte(strings.Replace(string(r11), "factory.pub", "other.pub", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	set.bundle(t, "untrusted", "1.1.0-other", "--key", filepath.Join(set.dir, "other.key"))
	set.recipes["0.9.0"] = writeUpgradeRecipe(t, set.dir, fixture.Base(t), upgradeRelease{"0.9.0", []string{pauseRef, appRepo + ":1.0"}, appRepo + ":1.0",
		[]string{"factory"}, "factory"}, upgradeOptions{command: podHealth, timeout: podHealthTimeout})
	set.bundle(t, "downgrade", "0.9.0", "--key", factoryKey)
	set.sticks["tampered"] = filepath.Join(set.dir, "stick-tampered.img")
	if err := rawdisk.Copy(set.sticks["tampered"], set.sticks["1.1.0"]); err != nil {
		t.Fatal(err)
	}
	rep, err := bundle.Inspect(set.sticks["tampered"])
	if err != nil {
		t.Fatal(err)
	}
	flipped := false // one byte in the middle of the first blob's bytes
	for _, f := range rep.Manifest.Files {
		if !flipped && strings.Contains(f.Path, "blobs/sha256/") && f.Size > 0 {
			flipByte(t, set.sticks["tampered"], rep.Offset+rep.Header+f.Offset+f.Size/2)
			flipped = true
		}
	}
	if !flipped {
		t.Fatalf("the 1.1 stick's manifest lists no blob: %+v", rep.Manifest.Files)
	}

	tech := &technician{t: t, sticks: set.sticks}
	reset := false
	res := vm.Boot(t, set.disk, append(tech.hands(), vm.WithName("upgrade-refusals"), vm.WithReboots(),
		vm.WithTimeout(applianceTimeout(25*time.Minute)),
		vm.OnConsole("kiln-import", func(m *vm.Monitor, line string) error {
			if reset || tech.plugged != "stick-1.1.0" || !strings.Contains(line, " blob(s) for ") {
				return nil
			}
			reset = true
			t.Logf("resetting the machine during the import: %s", line)
			return m.Reset()
		}))...)
	t.Logf("refusals and a reset mid-import: %s in one QEMU run", res.Duration.Round(time.Second))
	for _, step := range []string{"b1-boot PASS", "kiln-e2e: plug tampered", "b1-downgrade-unchanged", "kiln-e2e: plug 1.1.0", "b2-boot PASS", "b2-resumed-staged"} {
		if d, ok := res.When(step); ok {
			t.Logf("step %-28q at %s", step, d.Round(time.Second))
		}
	}
	readJournal(t, mustFind(t, set.disk, "root"), filepath.Join(filepath.Dir(res.Console), "upgrade-refusals-journal.txt"))

	requireAllPass(t, res)
	if !reset {
		t.Errorf("the machine was never reset during the 1.1.0 import")
	}
	for _, name := range []string{
		"b1-current", "b1-cri-workload", "b1-tampered-refused", "b1-tampered-unchanged", "b1-untrusted-refused", "b1-untrusted-unchanged",
		"b1-downgrade-refused", "b1-downgrade-unchanged",
		"b2-current", "b2-cri-workload", "b2-app-1.0-pinned", "b2-resumed-staged", "b2-pins-consistent",
	} {
		requirePass(t, res, name)
	}
	// Each refusal, on the console, says why and what to do.
	for _, want := range []string{
		"refused: bundle is damaged: blob sha256:",
		"refused: not signed by a trusted key (signed by [SHA256:",
		"refused: bundle is not newer than the running release: bundle 0.9.0 is older than the running 1.0.0",
	} {
		if _, ok := res.When(want); !ok {
			t.Errorf("console lacks %q", want)
		}
	}
	if got := len(res.Lines("nothing was changed")); got < 3 {
		t.Errorf("console has %d \"nothing was changed\" lines, want one per refused stick", got)
	}
	st := upgradeStatuses(t, res)
	if s, ok := st[2]; !ok || s.Current.Version != "1.0.0" || s.Staged == nil || s.Staged.Version != "1.1.0" || !s.PinsCurrent {
		t.Errorf("boot 2 status: %+v", s)
	}
}
