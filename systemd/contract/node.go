package contract

import (
	"fmt"
	"net"
	"strconv"
)

// Where things live on the node. The factory renders units and files that
// name these paths; the agents read and write them. Nothing else spells them.
const (
	// MountPoint is where the image partition is mounted, read-only.
	MountPoint = "/var/lib/kiln/images"
	// MountUnit is systemd's name for MountPoint's mount unit
	// (systemd-escape --path --suffix=mount /var/lib/kiln/images).
	MountUnit = "var-lib-kiln-images.mount"
	// AgentPath is the kiln binary the node's units run.
	AgentPath = MountPoint + "/" + AgentBinary
	// StorePath is the preloaded containers/storage store on the partition.
	StorePath = MountPoint + "/" + StorageDir
	// FirstBootMarker is written once first boot has every image locally.
	FirstBootMarker = "/var/lib/kiln/firstboot.done"

	// RegistryTarget is what to start to get the registry and its mirror
	// entry, e.g. during an upgrade reboot.
	RegistryTarget = "kiln-registry.target"

	// MirrorDropIn is the registries.conf drop-in kiln owns while the mirror
	// is on; MirrorTmpfiles removes it at every boot.
	MirrorDropIn   = "/etc/containers/registries.conf.d/50-kiln-mirror.conf"
	MirrorTmpfiles = "/etc/tmpfiles.d/kiln-mirror.conf"
	// PinsDropIn is the CRI-O drop-in that pins every image kiln placed.
	PinsDropIn = "/etc/crio/crio.conf.d/50-kiln-pins.conf"
	// CrioDropIn orders CRI-O after the partition when it reads the store,
	// and has the image restore run again after every start of CRI-O.
	CrioDropIn = "/etc/systemd/system/crio.service.d/10-kiln-images.conf"
	// StorageConf is containers/storage's configuration, shared by podman and CRI-O.
	StorageConf = "/etc/containers/storage.conf"

	// BundleUdevRule starts ImportUnit for every partition of the bundle
	// partition type (bundlefmt.PartitionType) that appears.
	BundleUdevRule = "/etc/udev/rules.d/90-kiln-bundle.rules"
	// ImportUnit imports the bundle on the partition its instance names
	// (the kernel's name, e.g. kiln-import@sdb1.service).
	ImportUnit = "kiln-import@.service"
	// ReleaseBeginUnit runs `kiln agent release begin` at every boot,
	// before CRI-O.
	ReleaseBeginUnit = "kiln-release-begin.service"
	// ReleaseCheckUnit runs the recipe's health check while a release is
	// being tried (`kiln agent release check`).
	ReleaseCheckUnit = "kiln-release-check.service"
	// ReleaseGoodUnit, on a disk whose OS is in A/B slots, lets a counted
	// boot reach boot-complete.target (and its entry be blessed) only when
	// the booted entry's release is confirmed (`kiln agent release confirmed`).
	ReleaseGoodUnit = "kiln-release-good.service"
	// ReleaseRegistryUnit starts RegistryTarget on an upgrade boot (a
	// release being tried), before CRI-O; it stops once the release is
	// confirmed and its images are in local storage (ReleaseWaitUnit).
	ReleaseRegistryUnit = "kiln-release-registry.service"
	// ReleaseWaitUnit, started by ReleaseCheckUnit after a confirm, stops
	// RegistryTarget once every image of the release is in local storage.
	ReleaseWaitUnit = "kiln-release-wait.service"
	// RestoreUnit runs `kiln agent restore-images` at every boot, after
	// CRI-O (which may wipe its store after an unclean shutdown) and before
	// the workloads: every kept image back in local storage.
	RestoreUnit = "kiln-restore-images.service"
)

// Preload modes: how the preloaded store reaches the node's runtime.
const (
	PreloadStore = "store" // an additional, read-only image store on the partition
	PreloadCopy  = "copy"  // copied into the node's main store at first boot
)

// PreloadModes lists the modes in the order the docs give them.
var PreloadModes = []string{PreloadStore, PreloadCopy}

// DefaultListen is the node registry's address when the recipe names none.
const DefaultListen = "127.0.0.1:5050"

// MaxManifestSize bounds a manifest, index or config: the node's registry
// refuses to index anything larger, so the factory refuses to fetch it (the
// distribution spec suggests 4 MiB as a limit registries may enforce).
const MaxManifestSize = 4 << 20

// ListenAddress is the address the node's registry listens on when the
// recipe (and so kiln.json) gives addr: DefaultListen when addr is empty,
// else addr if CheckListen accepts it. The recipe's loader, the units'
// renderer and the mirror gate all take the address from here.
func ListenAddress(addr string) (string, error) {
	if addr == "" {
		return DefaultListen, nil
	}
	return addr, CheckListen(addr)
}

// CheckListen reports whether the node's registry may listen on addr: a
// loopback IP (the registry is never exposed to the network; the units allow
// only localhost traffic) and an unprivileged port (it runs without
// capabilities).
func CheckListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not IP:PORT (e.g. %s)", addr, DefaultListen)
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q: the host must be a loopback IP such as 127.0.0.1 (the node's registry is never exposed to the network)", addr)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1024 || n > 65535 {
		return fmt.Errorf("%q: the port must be 1024-65535 (the registry runs without privileges)", addr)
	}
	return nil
}
