// Package units renders, at build time, the node's side of kiln: the systemd
// units that mount the image partition, serve it as a local registry, gate
// the runtime's mirror entry on that registry serving this content, and stop
// it all once first boot is done; plus the files that go with them (CRI-O
// pins, a tmpfiles.d cleanup, storage.conf). Every path and name they share
// with the node comes from systemd/contract; the programs the units run live
// in systemd/agent and behind `kiln agent`.
package units

import (
	"bytes"
	"embed"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// Defaults for Params' timeouts.
const (
	// VerityName is the image partition's dm-verity device, /dev/mapper/VerityName.
	VerityName = "kiln-images"

	// The wait for the image partition's device. Longer than systemd's
	// DefaultTimeoutStartSec (90 s): the job is queued as the root is
	// switched to, before udev's coldplug, and a starved boot (a udev worker
	// stuck for tens of seconds) must not look like a missing partition.
	defaultDevWait = 3 * time.Minute
	defaultGate    = 2 * time.Minute
	defaultWait    = time.Hour
	defaultImport  = 2 * time.Hour
	defaultReboot  = time.Minute
	defaultHealth  = 5 * time.Minute
)

// Params is what the units depend on. Build it with ParamsFrom.
type Params struct {
	// PartitionGUID is the image partition's unique partition GUID (not its
	// type GUID): the mount names the device by it.
	PartitionGUID string
	// Listen is the registry's loopback address (contract.ListenAddress:
	// contract.DefaultListen when empty).
	Listen string
	// AlwaysOn keeps the registry and mirror running on every boot instead
	// of stopping them once first boot has every image in local storage.
	AlwaysOn bool
	// Images are pinned for CRI-O (by digest and by name).
	Images []contract.Image
	// PreloadMode is how the preloaded store reaches the runtime: "store"
	// (an additional image store, read-only from the partition), "copy"
	// (copied into the main store at boot), or "" (nothing preloaded).
	PreloadMode string

	// RootHash (hex) and HashOffset (bytes into the partition) of the
	// image partition's dm-verity tree; "" mounts the partition directly
	// (the recipe turned verity off).
	RootHash   string
	HashOffset int64

	// Timeouts; zero means the default (3m, 2m, 1h).
	DeviceTimeout time.Duration // wait for the partition's device
	GateTimeout   time.Duration // wait for the registry to serve this content
	WaitTimeout   time.Duration // first boot: wait for every image in local storage
	ImportTimeout time.Duration // import a bundle from a stick (default 2h)
	// Reboot is what follows a staged release (the recipe's
	// upgrade.reboot): RebootCountdown (default) after RebootDelay (default
	// 1 minute, rounded up to whole minutes: shutdown counts in minutes),
	// RebootWindow at the calendar event Window, or RebootCommand (none).
	// RebootDelay defaults only when Reboot is empty: a countdown of 0
	// reboots at once.
	Reboot      string
	RebootDelay time.Duration
	Window      string

	// Health is the recipe's health check of a release being tried.
	Health Health

	// OSSlots: the disk's OS is in A/B slots, booted from counted boot
	// loader entries (kiln.json's osSlots).
	OSSlots bool
}

// Health is the recipe's upgrade.health (checked by the recipe's loader).
type Health struct {
	Units   []string
	Command []string
	Timeout time.Duration // default 5m
	// UnhealthyExitCode, 1–255 with a Command (0: none), is the command's
	// exit status for "broken for good": roll back without waiting.
	UnhealthyExitCode int
}

// Reboot policies (the recipe's upgrade.reboot).
const (
	RebootCountdown = "countdown"
	RebootWindow    = "window"
	RebootCommand   = "command"
)

// ParamsFrom builds Params from the partition's kiln.json and the
// partition's unique GUID.
func ParamsFrom(c *contract.Contents, partitionGUID string) Params {
	p := Params{PartitionGUID: partitionGUID, Listen: c.Registry.Listen, AlwaysOn: c.Registry.AlwaysOn, PreloadMode: c.Registry.PreloadMode}
	p.Images = c.Images
	p.OSSlots = c.OSSlots != nil
	return p
}

//go:embed *.service *.target *.mount
var unitFS embed.FS

var rootHashRE = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

var guidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// Render returns kiln's units and files for the node, sorted by name/path.
func Render(p Params) ([]ignition.Unit, []ignition.File, error) {
	v, err := p.values()
	if err != nil {
		return nil, nil, err
	}
	names := []string{contract.MountUnit, "kiln-images-failed.service", "kiln-registry.service",
		"kiln-mirror.service", contract.RegistryTarget, contract.ImportUnit, contract.ReleaseBeginUnit, contract.ReleaseCheckUnit,
		contract.RestoreUnit}
	enabled := map[string]bool{contract.MountUnit: true, contract.RegistryTarget: p.AlwaysOn, "kiln-firstboot.service": true,
		contract.ReleaseBeginUnit: true, contract.ReleaseCheckUnit: true, contract.ReleaseRegistryUnit: true, contract.RestoreUnit: true}
	if !p.AlwaysOn {
		// The registry runs at the first boot and at upgrade boots only;
		// with alwaysOn the enabled target starts it on every boot.
		names = append(names, "kiln-firstboot.service", contract.ReleaseRegistryUnit, contract.ReleaseWaitUnit)
	}
	if p.RootHash != "" {
		names = append(names, "kiln-images-verity.service")
	}
	if p.OSSlots {
		names = append(names, contract.ReleaseGoodUnit)
		enabled[contract.ReleaseGoodUnit] = true
	}
	if p.PreloadMode == contract.PreloadCopy {
		names = append(names, "kiln-preload-copy.service")
		enabled["kiln-preload-copy.service"] = true
	}
	sort.Strings(names)
	var units []ignition.Unit
	for _, name := range names {
		text, err := renderUnit(name, v)
		if err != nil {
			return nil, nil, err
		}
		units = append(units, ignition.Unit{Name: name, Contents: text, Enabled: enabled[name]})
	}

	pinConf, err := contract.RenderPins(p.Images)
	if err != nil {
		return nil, nil, err
	}
	files := []ignition.File{
		{Path: contract.PinsDropIn, Mode: 0o644, Contents: pinConf},
		// A drop-in left behind by a crash would point the runtime at a
		// registry that is not running: remove it at every boot, before
		// anything pulls; the gate writes it again once the registry serves.
		{Path: contract.MirrorTmpfiles, Mode: 0o644, Contents: []byte(
			"# Rendered by kiln: the mirror drop-in only exists while kiln-mirror.service runs.\n" +
				"r " + contract.MirrorDropIn + "\n")},
		// udev lower-cases ID_PART_ENTRY_TYPE (blkid's spelling); %k is the
		// partition's kernel name, which names the import unit's instance.
		{Path: contract.BundleUdevRule, Mode: 0o644, Contents: []byte(
			"# Rendered by kiln: an upgrade stick's bundle partition starts its import.\n" +
				`ACTION=="add", SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", ENV{ID_PART_ENTRY_TYPE}=="` +
				strings.ToLower(bundlefmt.PartitionType) + `", TAG+="systemd", ENV{SYSTEMD_WANTS}+="` +
				strings.Replace(contract.ImportUnit, "@", "@%k", 1) + "\"\n")},
	}
	// Every start of CRI-O (a crash's restart too) may follow an unclean
	// shutdown, after which CRI-O may wipe its store: the restore runs
	// again once it is up.
	crio := "# Rendered by kiln.\n"
	switch p.PreloadMode {
	case "", contract.PreloadCopy:
	case contract.PreloadStore:
		files = append(files,
			// The preloaded store, read-only on the image partition, is an
			// additional image store of the node's main store.
			ignition.File{Path: contract.StorageConf, Mode: 0o644, Contents: contract.StorageConfig{
				AdditionalImageStores: []string{contract.StorePath}}.Render()})
		// With the store path absent, podman and CRI-O refuse to start:
		// CRI-O waits for the partition's mount.
		crio += "[Unit]\n# CRI-O reads the preloaded store on the image partition.\nRequiresMountsFor=" + contract.StorePath + "\n"
	default:
		return nil, nil, fmt.Errorf("render units: preload mode %q: want %q or %q", p.PreloadMode, contract.PreloadStore, contract.PreloadCopy)
	}
	crio += "[Service]\n# After every start of CRI-O (it may have wiped its store: an unclean shutdown),\n" +
		"# kiln puts back the images it lost (" + contract.RestoreUnit + ", ordered after CRI-O).\n" +
		"ExecStartPost=-/usr/bin/systemctl --no-block restart " + contract.RestoreUnit + "\n"
	dev := orDefault(p.DeviceTimeout, defaultDevWait)
	files = append(files, ignition.File{Path: contract.CrioDropIn, Mode: 0o644, Contents: []byte(crio)},
		// A device's wait is the one bound systemd counts from when the job
		// was queued (as the root is switched to, before udev's coldplug):
		// say it here, as fstab's x-systemd.device-timeout= does, rather
		// than inherit the OS's DefaultTimeoutStartSec (90 s).
		deviceWait(v.DeviceUnit, "the image partition to appear", dev))
	if v.RootHash != "" {
		// The mount waits for the verity device, which appears only once the
		// partition has (its own wait) and veritysetup has opened it (its
		// own bound): a slow boot must not fail the mount through it first.
		files = append(files, deviceWait(`dev-mapper-`+strings.ReplaceAll(VerityName, "-", `\x2d`)+".device",
			"dm-verity to open the image partition", 2*dev))
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return units, files, nil
}

// deviceWait is a drop-in bounding how long the boot waits for a device
// unit (what, in words) before the jobs that need it fail.
func deviceWait(unit, what string, d time.Duration) ignition.File {
	return ignition.File{Path: "/etc/systemd/system/" + unit + ".d/10-kiln-wait.conf", Mode: 0o644, Contents: []byte(
		"# Rendered by kiln: how long the boot waits for " + what + "\n" +
			"# before the image partition's mount fails and kiln-images-failed.service says so.\n" +
			"[Unit]\nJobRunningTimeoutSec=" + seconds(d) + "\n")}
}

// values are the template's inputs, derived and checked.
type values struct {
	PartitionGUID, Device, MountPoint, MountUnit, Agent, Marker, DropIn, Listen string
	StateFile, ReleaseStore                                                     string
	ReleaseBeginUnit, ReleaseCheckUnit                                          string
	// RestoreBefore are the units the image restore runs before: the
	// kubelet, kiln's checks, the release's health units.
	RestoreBefore string
	// ServeTimeout bounds the upgrade boot's start of the registry and the
	// mirror gate (the registry's 60s start plus the gate's unit timeout).
	ServeTimeout                                                              string
	MountDevice, DeviceUnit, VerityName, RootHash                             string
	HashOffset                                                                int64
	AlwaysOn                                                                  bool
	DeviceTimeout, GateTimeout, GateUnitTimeout, WaitTimeout, WaitUnitTimeout string
	FailureMessage                                                            string
	ImportTimeout                                                             string
	// RebootExec is the import unit's ExecStartPost: how the reboot follows.
	RebootExec                       string
	HealthUnits, HealthCommand       []string
	HealthTimeout, HealthUnitTimeout string
	HealthUnhealthyExitCode          int
}

func (p Params) values() (values, error) {
	if !guidRE.MatchString(p.PartitionGUID) {
		return values{}, fmt.Errorf("render units: image partition GUID %q is not a GUID (want xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", p.PartitionGUID)
	}
	if p.RootHash != "" && (!rootHashRE.MatchString(p.RootHash) || p.HashOffset <= 0 || p.HashOffset%4096 != 0) {
		return values{}, fmt.Errorf("render units: verity root hash %q at offset %d: want 64 hex digits and a positive multiple of 4096", p.RootHash, p.HashOffset)
	}
	listen, err := contract.ListenAddress(p.Listen)
	if err != nil {
		return values{}, fmt.Errorf("render units: registry listen address %w", err)
	}
	guid := strings.ToLower(p.PartitionGUID) // udev's by-partuuid names are lower case
	dev := orDefault(p.DeviceTimeout, defaultDevWait)
	gt := orDefault(p.GateTimeout, defaultGate)
	wt := orDefault(p.WaitTimeout, defaultWait)
	v := values{
		PartitionGUID:    guid,
		Device:           "/dev/disk/by-partuuid/" + guid,
		MountDevice:      "/dev/disk/by-partuuid/" + guid,
		DeviceUnit:       `dev-disk-by\x2dpartuuid-` + strings.ReplaceAll(guid, "-", `\x2d`) + ".device", // systemd-escape --path
		VerityName:       VerityName,
		RootHash:         strings.ToLower(p.RootHash),
		HashOffset:       p.HashOffset,
		MountPoint:       contract.MountPoint,
		MountUnit:        contract.MountUnit,
		Agent:            contract.AgentPath,
		Marker:           contract.FirstBootMarker,
		DropIn:           contract.MirrorDropIn,
		Listen:           listen,
		StateFile:        contract.StateFile,
		ReleaseBeginUnit: contract.ReleaseBeginUnit,
		ReleaseCheckUnit: contract.ReleaseCheckUnit,
		ReleaseStore:     contract.ReleaseStore,
		ServeTimeout:     seconds(gt + 90*time.Second),
		AlwaysOn:         p.AlwaysOn,
		DeviceTimeout:    seconds(dev),
		GateTimeout:      seconds(gt),
		GateUnitTimeout:  seconds(gt + 90*time.Second), // and up to 60 s for a starting CRI-O (kiln-mirror.service)
		WaitTimeout:      seconds(wt),
		WaitUnitTimeout:  seconds(wt + time.Minute),
		ImportTimeout:    seconds(orDefault(p.ImportTimeout, defaultImport)),
	}
	ht := orDefault(p.Health.Timeout, defaultHealth)
	v.HealthUnits, v.HealthCommand = p.Health.Units, p.Health.Command
	v.HealthTimeout, v.HealthUnitTimeout = seconds(ht), seconds(ht+time.Minute)
	v.RestoreBefore = restoreBefore(p.Health.Units)
	if c := p.Health.UnhealthyExitCode; c < 0 || c > 255 || (c > 0 && len(p.Health.Command) == 0) {
		return values{}, fmt.Errorf("render units: health check unhealthy exit code %d: want 1-255, with a command", c)
	}
	v.HealthUnhealthyExitCode = p.Health.UnhealthyExitCode
	// Each word is written in double quotes: none may hold what systemd
	// would still interpret there.
	for _, a := range append(slices.Clone(p.Health.Units), p.Health.Command...) {
		if a == "" || strings.ContainsAny(a, "\"'%$\\\n") {
			return values{}, fmt.Errorf("render units: health check word %q: no quotes, %%, $, backslashes or empty words", a)
		}
	}
	switch p.Reboot {
	case "", RebootCountdown:
		delay := p.RebootDelay
		if p.Reboot == "" {
			delay = defaultReboot
		}
		mins := int64((max(delay, 0) + time.Minute - 1) / time.Minute)
		v.RebootExec = fmt.Sprintf(`/usr/sbin/shutdown --reboot +%d "kiln: the new release is staged; rebooting in %d minute(s) to try it (shutdown -c cancels)"`, mins, mins)
	case RebootWindow:
		if p.Window == "" || strings.ContainsAny(p.Window, "\"'%$\\\n") {
			return values{}, fmt.Errorf("render units: reboot window %q: want a systemd calendar event without quotes, %%, $ or backslashes", p.Window)
		}
		// A transient timer: the reboot happens at the window even when
		// the import unit is long gone; starting it again replaces nothing.
		v.RebootExec = fmt.Sprintf(`-/usr/bin/systemd-run --unit=kiln-upgrade-reboot --timer-property=AccuracySec=1s "--on-calendar=%s" /usr/bin/systemctl reboot`+"\n"+
			`ExecStartPost=/usr/bin/echo "kiln: the new release is staged; the appliance reboots to try it at the next maintenance window (%s)"`, p.Window, p.Window)
	case RebootCommand:
		v.RebootExec = `/usr/bin/echo "kiln: the new release is staged; reboot the appliance (systemctl reboot) to try it"`
	default:
		return values{}, fmt.Errorf("render units: reboot policy %q: want %s, %s or %s", p.Reboot, RebootCountdown, RebootWindow, RebootCommand)
	}
	if v.RootHash != "" {
		v.MountDevice = "/dev/mapper/" + VerityName
	}
	// Plain words only: the message goes through systemd's command-line
	// parsing, so no quotes, $, % or backslashes.
	v.FailureMessage = fmt.Sprintf("kiln: the image partition (partition GUID %s) was not mounted at %s within %s: it is missing, or damaged (dm-verity refused it). "+
		"The appliance's container images are on it, so they cannot be served. "+
		"Check that this is the disk the appliance was built for (a replaced disk must be reflashed with the kiln recovery image). "+
		"ls -l /dev/disk/by-partuuid lists the partitions present, journalctl -b -u %s -u kiln-images-verity shows why the mount failed.",
		guid, contract.MountPoint, v.DeviceTimeout, contract.MountUnit)
	return v, nil
}

// restoreBefore lists the units the image restore must end before: the
// kubelet, the health check of a release being tried, and the
// release's health units (its workloads), less those the restore itself
// comes after (CRI-O: the restore must see what CRI-O did to its store).
func restoreBefore(health []string) string {
	before := []string{"kubelet.service", contract.ReleaseCheckUnit}
	after := []string{"crio.service", "cri-o.service", contract.MountUnit, contract.ReleaseBeginUnit, "kiln-preload-copy.service", contract.RestoreUnit}
	for _, u := range health {
		if !slices.Contains(after, u) && !slices.Contains(before, u) {
			before = append(before, u)
		}
	}
	return strings.Join(before, " ")
}

func renderUnit(name string, v any) (string, error) {
	t, err := template.New(name).Option("missingkey=error").ParseFS(unitFS, name)
	if err != nil {
		return "", fmt.Errorf("unit template %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, v); err != nil {
		return "", fmt.Errorf("render unit %s: %w", name, err)
	}
	return b.String(), nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// seconds spells a duration the way both systemd and Go's flag parsing read it.
func seconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) + "s"
}
