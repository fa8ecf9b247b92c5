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
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/systemd/agent/pins"
	"github.com/kiln-appliance/kiln/systemd/agent/preloadcopy"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Defaults for Params' timeouts.
const (
	defaultDevWait = 90 * time.Second
	defaultGate    = 2 * time.Minute
	defaultWait    = time.Hour
)

// Params is what the units depend on. Build it with ParamsFrom.
type Params struct {
	// PartitionGUID is the image partition's unique partition GUID (not its
	// type GUID): the mount names the device by it.
	PartitionGUID string
	// Listen is the registry's loopback address; contract.DefaultListen when empty.
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

	// Timeouts; zero means the default (90s, 2m, 1h).
	DeviceTimeout time.Duration // wait for the partition's device
	GateTimeout   time.Duration // wait for the registry to serve this content
	WaitTimeout   time.Duration // first boot: wait for every image in local storage
}

// ParamsFrom builds Params from the partition's kiln.json and the
// partition's unique GUID.
func ParamsFrom(c *contract.Contents, partitionGUID string) Params {
	p := Params{PartitionGUID: partitionGUID, Listen: c.Registry.Listen, AlwaysOn: c.Registry.AlwaysOn, PreloadMode: c.Registry.PreloadMode}
	p.Images = c.Images
	return p
}

//go:embed *.service *.target *.mount
var unitFS embed.FS

var guidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// Render returns kiln's units and files for the node, sorted by name/path.
func Render(p Params) ([]ignition.Unit, []ignition.File, error) {
	v, err := p.values()
	if err != nil {
		return nil, nil, err
	}
	names := []string{contract.MountUnit, "kiln-images-failed.service", "kiln-registry.service",
		"kiln-mirror.service", contract.RegistryTarget}
	enabled := map[string]bool{contract.MountUnit: true, contract.RegistryTarget: p.AlwaysOn, "kiln-firstboot.service": true}
	if !p.AlwaysOn {
		names = append(names, "kiln-firstboot.service")
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

	pinConf, err := pins.Render(p.Images)
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
	}
	switch p.PreloadMode {
	case "", contract.PreloadCopy:
	case contract.PreloadStore:
		files = append(files,
			// The preloaded store, read-only on the image partition, is an
			// additional image store of the node's main store.
			ignition.File{Path: contract.StorageConf, Mode: 0o644, Contents: preloadcopy.StorageConf(preloadcopy.Conf{
				AdditionalImageStores: []string{contract.StorePath}})},
			// With the store path absent, podman and CRI-O refuse to start:
			// CRI-O waits for the partition's mount.
			ignition.File{Path: contract.CrioDropIn, Mode: 0o644, Contents: []byte(
				"# Rendered by kiln: CRI-O reads the preloaded store on the image partition.\n" +
					"[Unit]\nRequiresMountsFor=" + contract.StorePath + "\n")})
	default:
		return nil, nil, fmt.Errorf("render units: preload mode %q: want %q or %q", p.PreloadMode, contract.PreloadStore, contract.PreloadCopy)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return units, files, nil
}

// values are the template's inputs, derived and checked.
type values struct {
	PartitionGUID, Device, MountPoint, MountUnit, Agent, Marker, DropIn, Listen string
	AlwaysOn                                                                    bool
	DeviceTimeout, GateTimeout, GateUnitTimeout, WaitTimeout, WaitUnitTimeout   string
	FailureMessage                                                              string
}

func (p Params) values() (values, error) {
	if !guidRE.MatchString(p.PartitionGUID) {
		return values{}, fmt.Errorf("render units: image partition GUID %q is not a GUID (want xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", p.PartitionGUID)
	}
	listen := p.Listen
	if listen == "" {
		listen = contract.DefaultListen
	}
	if err := contract.CheckListen(listen); err != nil {
		return values{}, fmt.Errorf("render units: registry listen address %w", err)
	}
	guid := strings.ToLower(p.PartitionGUID) // udev's by-partuuid names are lower case
	dev := orDefault(p.DeviceTimeout, defaultDevWait)
	gt := orDefault(p.GateTimeout, defaultGate)
	wt := orDefault(p.WaitTimeout, defaultWait)
	v := values{
		PartitionGUID:   guid,
		Device:          "/dev/disk/by-partuuid/" + guid,
		MountPoint:      contract.MountPoint,
		MountUnit:       contract.MountUnit,
		Agent:           contract.AgentPath,
		Marker:          contract.FirstBootMarker,
		DropIn:          contract.MirrorDropIn,
		Listen:          listen,
		AlwaysOn:        p.AlwaysOn,
		DeviceTimeout:   seconds(dev),
		GateTimeout:     seconds(gt),
		GateUnitTimeout: seconds(gt + 30*time.Second),
		WaitTimeout:     seconds(wt),
		WaitUnitTimeout: seconds(wt + time.Minute),
	}
	// Plain words only: the message goes through systemd's command-line
	// parsing, so no quotes, $, % or backslashes.
	v.FailureMessage = fmt.Sprintf("kiln: the image partition (partition GUID %s) was not mounted at %s within %s. "+
		"The appliance's container images are on it, so they cannot be served. "+
		"Check that this is the disk the appliance was built for (a replaced disk must be reflashed with the kiln recovery image). "+
		"ls -l /dev/disk/by-partuuid lists the partitions present, journalctl -b -u %s shows why the mount failed.",
		guid, contract.MountPoint, v.DeviceTimeout, contract.MountUnit)
	return v, nil
}

func renderUnit(name string, v values) (string, error) {
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
