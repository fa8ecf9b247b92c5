package units

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
	"github.com/kiln-appliance/kiln/test/golden"
)

const testGUID = "0F3C1A2B-1111-4222-8333-444455556666"

const testRootHash = "0f3c1a2b11114222833344445555666677778888999900001111222233334444"

var testImages = []contract.Image{
	{Name: "quay.io/acme/app:1.2", Digest: "sha256:" + strings.Repeat("a", 64)},
	{Name: "nginx", Digest: "sha256:" + strings.Repeat("b", 64)},
}

func TestRenderGolden(t *testing.T) {
	tests := []struct {
		name string
		p    Params
	}{
		{"firstboot", Params{PartitionGUID: testGUID, Images: testImages}},
		{"alwayson", Params{PartitionGUID: testGUID, AlwaysOn: true, Images: testImages}},
		{"custom", Params{PartitionGUID: testGUID, Listen: "127.0.0.1:6000", Images: testImages,
			DeviceTimeout: 30 * time.Second, GateTimeout: 45 * time.Second, WaitTimeout: 10 * time.Minute}},
		{"preload-store", Params{PartitionGUID: testGUID, Images: testImages, PreloadMode: contract.PreloadStore}},
		{"preload-copy", Params{PartitionGUID: testGUID, Images: testImages, PreloadMode: contract.PreloadCopy}},
		{"reboot-window", Params{PartitionGUID: testGUID, Images: testImages, Reboot: RebootWindow, Window: "Sun *-*-* 03:00:00"}},
		{"reboot-command", Params{PartitionGUID: testGUID, Images: testImages, Reboot: RebootCommand}},
		{"health", Params{PartitionGUID: testGUID, Images: testImages, Health: Health{Units: []string{"crio.service", "app.service"},
			Command: []string{"/usr/bin/curl", "-fsS", "http://127.0.0.1:8080/healthz"}, Timeout: 90 * time.Second, UnhealthyExitCode: 3}}},
		{"reboot-countdown", Params{PartitionGUID: testGUID, Images: testImages, Reboot: RebootCountdown, RebootDelay: 5 * time.Minute}},
		{"verity", Params{PartitionGUID: testGUID, Images: testImages, RootHash: testRootHash, HashOffset: 7 << 20}},
		{"os-slots", Params{PartitionGUID: testGUID, Images: testImages, OSSlots: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			units, files, err := Render(tt.p)
			if err != nil {
				t.Fatal(err)
			}
			verify(t, units, files...)
			var b bytes.Buffer
			for _, u := range units {
				fmt.Fprintf(&b, "### unit %s enabled=%v\n%s\n", u.Name, u.Enabled, u.Contents)
			}
			for _, f := range files {
				fmt.Fprintf(&b, "### file %s mode=%#o\n%s\n", f.Path, f.Mode, f.Contents)
			}
			golden.Check(t, filepath.Join("testdata", tt.name+".golden"), b.Bytes())
		})
	}
}

// A reflash stick's units: attended (asks on the console) and unattended.
func TestRenderReflashGolden(t *testing.T) {
	for _, unattended := range []bool{false, true} {
		name := "reflash-attended"
		if unattended {
			name = "reflash-unattended"
		}
		t.Run(name, func(t *testing.T) {
			units, err := RenderReflash(ReflashParams{PartitionGUID: testGUID, Unattended: unattended})
			if err != nil {
				t.Fatal(err)
			}
			verify(t, units)
			var b bytes.Buffer
			for _, u := range units {
				fmt.Fprintf(&b, "### unit %s enabled=%v\n%s\n", u.Name, u.Enabled, u.Contents)
			}
			golden.Check(t, filepath.Join("testdata", name+".golden"), b.Bytes())
		})
	}
	if _, err := RenderReflash(ReflashParams{PartitionGUID: "kiln-reflash"}); err == nil {
		t.Error("a partition name instead of a GUID was accepted")
	}
}

// The alwaysOn switch decides what runs at boot: the target itself, or the
// first-boot service that stops the registry once it is no longer needed
// and the upgrade boot's service that starts it while a release is tried.
func TestRenderAlwaysOn(t *testing.T) {
	for _, alwaysOn := range []bool{false, true} {
		units, _, err := Render(Params{PartitionGUID: testGUID, AlwaysOn: alwaysOn, Images: testImages})
		if err != nil {
			t.Fatal(err)
		}
		enabled := map[string]bool{}
		for _, u := range units {
			if u.Enabled {
				enabled[u.Name] = true
			}
		}
		want := map[string]bool{contract.MountUnit: true, "kiln-firstboot.service": true, contract.ReleaseBeginUnit: true, contract.ReleaseCheckUnit: true,
			contract.ReleaseRegistryUnit: true, contract.RestoreUnit: true}
		if alwaysOn {
			want = map[string]bool{contract.MountUnit: true, contract.RegistryTarget: true, contract.ReleaseBeginUnit: true, contract.ReleaseCheckUnit: true,
				contract.RestoreUnit: true}
		}
		if fmt.Sprint(enabled) != fmt.Sprint(want) {
			t.Errorf("alwaysOn=%v: enabled units %v, want %v", alwaysOn, enabled, want)
		}
	}
}

func TestParamsFrom(t *testing.T) {
	c := &contract.Contents{
		Registry: contract.Registry{Listen: "127.0.0.1:5051", AlwaysOn: true},
		Images:   []contract.Image{{Name: "quay.io/acme/app:1.2", Digest: testImages[0].Digest}},
	}
	p := ParamsFrom(c, testGUID)
	if p.Listen != "127.0.0.1:5051" || !p.AlwaysOn || len(p.Images) != 1 || p.Images[0] != testImages[0] || p.PartitionGUID != testGUID {
		t.Fatalf("ParamsFrom = %+v", p)
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name string
		p    Params
		want string
	}{
		{"no guid", Params{}, "is not a GUID"},
		{"label not guid", Params{PartitionGUID: "kiln-images"}, "is not a GUID"},
		{"public listen", Params{PartitionGUID: testGUID, Listen: "0.0.0.0:5050"}, "loopback"},
		{"hostname listen", Params{PartitionGUID: testGUID, Listen: "localhost:5050"}, "loopback"},
		{"privileged port", Params{PartitionGUID: testGUID, Listen: "127.0.0.1:443"}, "1024-65535"},
		{"no port", Params{PartitionGUID: testGUID, Listen: "127.0.0.1"}, "IP:PORT"},
		{"bad image", Params{PartitionGUID: testGUID, Images: []contract.Image{{Name: "Quay.io/UPPER:x", Digest: testImages[0].Digest}}}, "not a valid image reference"},
		{"bad root hash", Params{PartitionGUID: testGUID, RootHash: "abc", HashOffset: 4096}, "64 hex digits"},
		{"bad hash offset", Params{PartitionGUID: testGUID, RootHash: testRootHash, HashOffset: 100}, "multiple of 4096"},
		{"bad digest", Params{PartitionGUID: testGUID, Images: []contract.Image{{Name: "quay.io/a:1", Digest: "sha256:123"}}}, "digest"},
		{"window missing", Params{PartitionGUID: testGUID, Reboot: RebootWindow}, `reboot window ""`},
		{"window quoted", Params{PartitionGUID: testGUID, Reboot: RebootWindow, Window: `Sun "03:00"`}, "without quotes"},
		{"reboot policy", Params{PartitionGUID: testGUID, Reboot: "later"}, `reboot policy "later"`},
		{"health quote", Params{PartitionGUID: testGUID, Health: Health{Command: []string{"/bin/sh", `"x"`}}}, "health check word"},
		{"health percent", Params{PartitionGUID: testGUID, Health: Health{Units: []string{"a%i.service"}}}, "health check word"},
		{"unhealthy code range", Params{PartitionGUID: testGUID, Health: Health{Command: []string{"/bin/true"}, UnhealthyExitCode: 256}}, "unhealthy exit code 256: want 1-255, with a command"},
		{"unhealthy code without command", Params{PartitionGUID: testGUID, Health: Health{UnhealthyExitCode: 3}}, "unhealthy exit code 3: want 1-255, with a command"},
	}
	// A countdown of 0 (the recipe's "0m") reboots at once, not after the default.
	units, _, err := Render(Params{PartitionGUID: testGUID, Reboot: RebootCountdown})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		if u.Name == contract.ImportUnit && !strings.Contains(u.Contents, "shutdown --reboot +0 ") {
			t.Errorf("countdown 0:\n%s", u.Contents)
		}
		// The stick may be pulled as soon as the console says so, before
		// ExecStartPost (the reboot policy) runs: a unit bound to the
		// device would be stopped there and never reboot (seen in the
		// QEMU field-upgrade scenario).
		if u.Name == contract.ImportUnit && strings.Contains(u.Contents, "BindsTo=") {
			t.Errorf("the import unit is bound to the stick's device:\n%s", u.Contents)
		}
		// A stick left in across a reboot is imported at boot: never
		// racing the begin that decides which release this boot runs.
		if u.Name == contract.ImportUnit && !strings.Contains(u.Contents, "After="+contract.ReleaseBeginUnit+"\n") {
			t.Errorf("the import unit is not ordered after %s:\n%s", contract.ReleaseBeginUnit, u.Contents)
		}
	}
	// Every policy a recipe may name renders.
	for _, policy := range recipes.RebootPolicies {
		if _, _, err := Render(Params{PartitionGUID: testGUID, Reboot: policy, Window: "Sun *-*-* 03:00:00"}); err != nil {
			t.Errorf("recipe reboot policy %s: %v", policy, err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Render(tt.p)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Render error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// verify runs systemd-analyze verify on the units inside a throwaway root
// that holds the host's system units, the commands the units run, and a
// stand-in for the agent binary at its path on the image partition; the
// drop-ins among files are verified on a stand-in of the unit they extend
// (CRI-O's own unit, as the e2e base ships it). Any output is a failure:
// systemd-analyze exits 0 on unknown keys and bad values.
func verify(t *testing.T, units []ignition.Unit, files ...ignition.File) {
	t.Helper()
	root := t.TempDir()
	unitDir := filepath.Join(root, "etc/systemd/system")
	mustRun(t, "mkdir", "-p", unitDir, filepath.Join(root, "usr/lib/systemd"), filepath.Join(root, "usr/bin"),
		filepath.Join(root, "usr/sbin"), filepath.Join(root, "bin"), filepath.Dir(filepath.Join(root, contract.AgentPath)))
	mustRun(t, "cp", "-r", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/"))
	for _, bin := range []string{"/usr/bin/echo", "/usr/bin/rm", "/usr/bin/systemctl", "/usr/sbin/shutdown", "/usr/bin/systemd-run",
		"/usr/sbin/veritysetup", "/usr/bin/dd", "/bin/sh"} {
		mustRun(t, "cp", bin, filepath.Join(root, bin))
	}
	mustRun(t, "cp", "/usr/bin/true", filepath.Join(root, contract.AgentPath))
	mustRun(t, "mkdir", "-p", filepath.Join(root, recovery.MountPoint, "bin"))
	mustRun(t, "cp", "/usr/bin/true", filepath.Join(root, recovery.MountPoint, recovery.AgentBinary))
	var paths []string
	for _, u := range units {
		p := filepath.Join(unitDir, u.Name)
		if err := os.WriteFile(p, []byte(u.Contents), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	for _, f := range files {
		dir := filepath.Dir(f.Path)
		if filepath.Dir(dir) != "/etc/systemd/system" || !strings.HasSuffix(dir, ".service.d") {
			continue
		}
		base := strings.TrimSuffix(filepath.Base(dir), ".d")
		stand := "[Unit]\nDescription=stand-in\n[Service]\nType=notify\nExecStart=/usr/bin/echo\n"
		mustRun(t, "mkdir", "-p", filepath.Join(root, dir))
		if err := os.WriteFile(filepath.Join(unitDir, base), []byte(stand), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f.Path), f.Contents, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, filepath.Join(unitDir, base))
	}
	// The enabled units installed as systemctl enable would: the targets
	// that want them then order themselves after them, and verify's start
	// of multi-user.target finds an ordering cycle that makes systemd drop
	// a job (kiln-release-good.service once was).
	installed := false
	for _, u := range units {
		if !u.Enabled {
			continue
		}
		for _, line := range strings.Split(u.Contents, "\n") {
			k, v, _ := strings.Cut(line, "=")
			kind := map[string]string{"WantedBy": ".wants", "RequiredBy": ".requires"}[k]
			if kind == "" {
				continue
			}
			for _, target := range strings.Fields(v) {
				dir := filepath.Join(unitDir, target+kind)
				mustRun(t, "mkdir", "-p", dir)
				mustRun(t, "ln", "-sf", "../"+u.Name, filepath.Join(dir, u.Name))
				installed = installed || target == "multi-user.target"
			}
		}
	}
	if installed {
		paths = append(paths, "multi-user.target")
	}
	cmd := exec.Command("systemd-analyze", append([]string{"verify", "--root=" + root}, paths...)...)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// The tmpfiles.d line really removes a stale mirror drop-in, as
// systemd-tmpfiles-setup.service does at boot (--remove --boot).
func TestTmpfilesRemovesStaleDropIn(t *testing.T) {
	_, files, err := Render(Params{PartitionGUID: testGUID, Images: testImages})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var conf string
	for _, f := range files {
		if f.Path == contract.MirrorTmpfiles {
			conf = filepath.Join(root, "kiln-mirror.conf")
			if err := os.WriteFile(conf, f.Contents, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if conf == "" {
		t.Fatalf("no %s rendered", contract.MirrorTmpfiles)
	}
	stale := filepath.Join(root, "etc/containers/registries.conf.d/50-kiln-mirror.conf")
	keep := filepath.Join(root, "etc/containers/registries.conf.d/10-admin.conf")
	for _, p := range []string{stale, keep} {
		mustRun(t, "mkdir", "-p", filepath.Dir(p))
		if err := os.WriteFile(p, []byte("# x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("systemd-tmpfiles", "--root="+root, "--remove", "--boot", conf).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-tmpfiles: %v\n%s", err, out)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale drop-in survived boot cleanup: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("an admin's drop-in was touched: %v", err)
	}
}

// The mount unit's name is what systemd derives from its path.
func TestMountUnitName(t *testing.T) {
	out, err := exec.Command("systemd-escape", "--path", "--suffix=mount", contract.MountPoint).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != contract.MountUnit {
		t.Fatalf("systemd-escape says %s, contract.MountUnit is %s", got, contract.MountUnit)
	}
}

// kiln-images-failed.service says nothing while the system shuts down
// (systemd starts OnFailure= units for a failed stop too: the image
// partition still held at shutdown is not missing or damaged), and speaks
// in every other state: its ExecCondition, run with a systemctl stand-in
// that reports each state.
func TestImagesFailedSilentAtShutdown(t *testing.T) {
	units, _, err := Render(Params{PartitionGUID: testGUID, Images: testImages})
	if err != nil {
		t.Fatal(err)
	}
	var cond string
	for _, u := range units {
		if u.Name != "kiln-images-failed.service" {
			continue
		}
		for _, l := range strings.Split(u.Contents, "\n") {
			if c, ok := strings.CutPrefix(l, "ExecCondition=/bin/sh -c "); ok {
				cond = strings.Trim(c, "'")
			}
		}
	}
	if cond == "" {
		t.Fatal("kiln-images-failed.service has no ExecCondition=/bin/sh -c '…': it would speak during a shutdown")
	}
	for state, runs := range map[string]bool{"stopping": false, "starting": true, "degraded": true, "running": true, "maintenance": true} {
		bin := t.TempDir()
		stand := "#!/bin/sh\n[ \"$1\" = is-system-running ] || exit 2\necho " + state + "\n"
		if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte(stand), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("/bin/sh", "-c", cond)
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case err != nil && !errors.As(err, &exit):
			t.Fatalf("%s: %v", state, err)
		case runs && err != nil:
			t.Errorf("system %s: the condition skips the message (%v)", state, err)
		case !runs && (err == nil || exit.ExitCode() == 255 || exit.ExitCode() < 1):
			t.Errorf("system %s: the condition lets the message run (%v), want exit 1–254 (skip)", state, err)
		}
	}
}

// The device drop-ins are named after the devices the units wait for, as
// systemd derives their unit names (a wrong name would be a drop-in nothing
// reads, and the OS's 90 s would stay the wait).
func TestDeviceWaitNames(t *testing.T) {
	p := Params{PartitionGUID: testGUID, Images: testImages, RootHash: strings.Repeat("ab", 32), HashOffset: 4096}
	_, files, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, dev := range []string{"/dev/disk/by-partuuid/" + strings.ToLower(p.PartitionGUID), "/dev/mapper/" + VerityName} {
		out, err := exec.Command("systemd-escape", "--path", "--suffix=device", dev).Output()
		if err != nil {
			t.Fatal(err)
		}
		want["/etc/systemd/system/"+strings.TrimSpace(string(out))+".d/10-kiln-wait.conf"] = true
	}
	for _, f := range files {
		if strings.HasSuffix(f.Path, "/10-kiln-wait.conf") && !want[f.Path] {
			t.Errorf("drop-in %s names no device the units wait for", f.Path)
		}
		delete(want, f.Path)
	}
	for path := range want {
		t.Errorf("no drop-in %s", path)
	}
}
