// Package recipes defines the kiln recipe format: the Go types, strict YAML
// parsing with file:line:column errors, validation, and the lock file.
package recipes

// APIVersion and the kinds of document kiln reads and writes.
const (
	APIVersion = "kiln.dev/v1alpha1"
	KindRecipe = "Appliance"
	KindLock   = "Lock"
)

// Recipe is one appliance: a base disk image plus the container images it
// must carry, and how the node should serve and pin them.
type Recipe struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`

	Name    string `yaml:"name"`    // appliance name, e.g. "acme-edge"
	Version string `yaml:"version"` // appliance version, e.g. "1.4.0"
	Arch    string `yaml:"arch"`    // GOARCH spelling: amd64, arm64; default amd64

	Base           Base           `yaml:"base"`
	Disk           Disk           `yaml:"disk"`
	ImagePartition ImagePartition `yaml:"imagePartition"`
	Images         []Image        `yaml:"images"`
	Registry       Registry       `yaml:"registry"`
	Preload        Preload        `yaml:"preload"`
	Ignition       Ignition       `yaml:"ignition"`
	// Trust lists the public key files (PEM, as `kiln key generate` writes)
	// whose signatures the appliance accepts on upgrade bundles.
	Trust   []string    `yaml:"trust,omitempty"`
	Release ReleaseSpec `yaml:"release"`
	Upgrade Upgrade     `yaml:"upgrade"`
	Reflash Reflash     `yaml:"reflash"`

	// SecureBoot, when set, makes the disk Secure Boot-ready: signed
	// unified kernel images and systemd-boot, and the keys to enrol.
	SecureBoot *SecureBoot `yaml:"secureBoot,omitempty"`

	// Path is the file the recipe was read from; Dir is its directory,
	// against which relative paths in the recipe are resolved. Not YAML.
	Path string `yaml:"-"`
	Dir  string `yaml:"-"`

	// pos remembers where each field was written (by field path, e.g.
	// "images[0].source"), so later checks such as CheckFiles can point at it.
	pos map[string]position
}

// SecureBoot names the public half of a factory's Secure Boot keys, the
// directory `kiln key secureboot DIR` wrote: its db certificate (db.crt)
// and the signed lists systemd-boot enrols (PK.auth, KEK.auth, db.auth).
// The db private key is never named here: `kiln build --secure-boot-key`
// takes it, so a recipe can be shared without it.
type SecureBoot struct {
	Keys string `yaml:"keys"` // the directory, relative to the recipe
}

// Base is the CoreOS-like raw disk image the appliance is built on.
type Base struct {
	// Path to a raw disk image, optionally compressed (.gz, .xz, .zst),
	// relative to the recipe's directory.
	Path string `yaml:"path"`
	// Digest, when set ("sha256:…"), is checked against the base file as read
	// (the compressed bytes, if compressed).
	Digest string `yaml:"digest,omitempty"`
}

// Disk is the output disk image.
type Disk struct {
	// Size of the output disk: "fit" (default: just large enough) or a size
	// such as "8GiB", "16G", "4096MiB".
	Size Size `yaml:"size"`
}

// ImagePartition is the dedicated partition that carries the images.
type ImagePartition struct {
	// Size: "auto" (default: content plus Headroom) or a fixed size.
	Size Size `yaml:"size"`
	// Headroom, in percent of the content, added when Size is auto. Default 10.
	Headroom *int `yaml:"headroom,omitempty"`
	// Filesystem of the partition. Only "squashfs" today (see docs/FILESYSTEM.md).
	Filesystem string `yaml:"filesystem"`
	// Compression of the filesystem: "none" (default; layers are already
	// compressed), "zstd", "gzip", "xz", "lz4".
	Compression string `yaml:"compression"`
	// Placement: "auto" (default: before-root when the base's last
	// partition is root, else end), "before-root" (root moves after the
	// image partition, so the node can still grow root into the rest of
	// its disk at first boot) or "end" (after the base's last partition).
	Placement string `yaml:"placement"`
	// Verity: protect the partition with a dm-verity hash tree (default
	// true); false for node kernels without dm-verity.
	Verity *bool `yaml:"verity,omitempty"`
}

// Image is one container image the appliance needs.
type Image struct {
	// Name is the reference workloads use, e.g. "quay.io/acme/app:1.2" or
	// "quay.io/acme/app@sha256:…". It is what the node's registry serves and
	// what the pins name.
	Name string `yaml:"name"`
	// Source is where the factory fetches it from when that differs from
	// Name: "docker://REF", "oci:DIR[:TAG]" or "docker-archive:FILE[:REF]".
	// Relative paths are resolved against the recipe's directory.
	Source string `yaml:"source,omitempty"`
	// Serve: put the image in the OCI layout served by the node's registry.
	// Default true.
	Serve *bool `yaml:"serve,omitempty"`
	// Preload: put the image in the preloaded containers/storage store.
	// Default false.
	Preload *bool `yaml:"preload,omitempty"`
}

// Registry configures the temporary local registry on the node.
type Registry struct {
	// Listen address; default "127.0.0.1:5050".
	Listen string `yaml:"listen,omitempty"`
	// AlwaysOn keeps the registry and its mirror entry after first boot.
	AlwaysOn bool `yaml:"alwaysOn,omitempty"`
	// MirrorTags sends tag pulls to the mirror too, not only digest pulls.
	// Default true.
	MirrorTags *bool `yaml:"mirrorTags,omitempty"`
}

// Preload configures the preloaded containers/storage store.
type Preload struct {
	// Mode: "store" (default: the store is an additional image store, read-only)
	// or "copy" (copied into the node's main store at first boot).
	Mode string `yaml:"mode,omitempty"`
}

// Ignition holds the recipe's own additions to the Ignition config.
type Ignition struct {
	// Version of the Ignition spec to emit; default "3.3.0".
	Version string `yaml:"version,omitempty"`
	// Fragments are Ignition config files merged into the rendered config,
	// relative to the recipe's directory.
	Fragments []string `yaml:"fragments,omitempty"`
	// SSHKeys are authorized keys for User (default "core").
	SSHKeys []string `yaml:"sshAuthorizedKeys,omitempty"`
	User    string   `yaml:"user,omitempty"`
}

// Upgrade configures field upgrades on the node.
type Upgrade struct {
	// Reboot is what follows an imported (staged) release: "countdown"
	// (default: reboot RebootDelay later), "window" (reboot at the next
	// RebootWindow) or "command" (only when someone reboots the node).
	Reboot string `yaml:"reboot,omitempty"`
	// RebootDelay is the countdown, in whole minutes ("1m", default; "0m"
	// reboots at once). Only with reboot: countdown.
	RebootDelay string `yaml:"rebootDelay,omitempty"`
	// RebootWindow is a systemd calendar event (systemd.time(7)), e.g.
	// "Sun *-*-* 03:00:00". Required with reboot: window.
	RebootWindow string `yaml:"rebootWindow,omitempty"`
	// Health decides, at the upgrade boot, whether the new release is
	// confirmed or rolled back.
	Health Health `yaml:"health"`
}

// Health is the health check of a release being tried.
type Health struct {
	// Units must be active, e.g. crio.service, app.service.
	Units []string `yaml:"units,omitempty"`
	// Command, optional, must exit 0: an absolute program path and its
	// arguments (no shell), e.g. [/usr/bin/curl, -fsS, http://127.0.0.1:8080/healthz].
	Command []string `yaml:"command,omitempty"`
	// Timeout for units and command together; default 5m, at most 1h.
	Timeout string `yaml:"timeout,omitempty"`
	// UnhealthyExitCode, optional (1–255, only with Command), is the
	// command's exit status for "broken for good": the release is rolled
	// back at once instead of after Timeout. Any other failure is "not yet".
	UnhealthyExitCode int `yaml:"unhealthyExitCode,omitempty"`
}

// Reflash configures the recovery stick (kiln reflash-stick): which disk
// its boot overwrites, and whether it asks first.
type Reflash struct {
	// Unattended: write without asking on the console (default false: the
	// technician types "yes" or the disk's serial).
	Unattended bool `yaml:"unattended,omitempty"`
	// Target picks the disk; empty: the one non-removable disk that is
	// neither the stick nor mounted.
	Target ReflashTarget `yaml:"target"`
}

// ReflashTarget is a rule for the disk a reflash writes; every rule given
// must match.
type ReflashTarget struct {
	// Path is a glob of device paths, e.g. /dev/disk/by-path/pci-0000:00:17.0-ata-1
	// or /dev/disk/by-id/nvme-Samsung*.
	Path string `yaml:"path,omitempty"`
	// Model is a glob of the disk's model as sysfs shows it, e.g. "Samsung SSD*".
	Model string `yaml:"model,omitempty"`
	// MinSize and MaxSize bound the disk's size, e.g. 100GiB.
	MinSize Size `yaml:"minSize,omitempty"`
	MaxSize Size `yaml:"maxSize,omitempty"`
}

// ReleaseSpec is the recipe's `release:` section: what a release owns on the
// node besides its images (the node's record of a release, built from it, is
// contract.Release).
type ReleaseSpec struct {
	Files []ReleaseFileSpec `yaml:"files,omitempty"`
}

// ReleaseFileSpec is one file the release owns: written by the factory build
// through Ignition and replaced by an upgrade bundle (the node keeps the
// previous set for rollback).
type ReleaseFileSpec struct {
	// Path on the node, under one of contract.ReleaseDirs, e.g.
	// /etc/containers/systemd/app.container.
	Path string `yaml:"path"`
	// Source is the file's content, relative to the recipe's directory.
	Source string `yaml:"source"`
	// Mode is the octal permission bits; default "0644".
	Mode string `yaml:"mode,omitempty"`
}

// Size is a byte count written in YAML as "auto", "fit", a plain integer
// (bytes) or a whole number with a unit: B; K, M, G, T and KiB, MiB, GiB, TiB
// are binary (K = KiB = 1024); KB, MB, GB, TB are decimal (KB = 1000).
// Zero with Auto false means "not set".
type Size struct {
	Bytes int64
	Auto  bool // "auto" or "fit"
}
