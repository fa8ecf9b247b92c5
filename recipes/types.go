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
	Trust   []string `yaml:"trust,omitempty"`
	Release Release  `yaml:"release"`

	// Path is the file the recipe was read from; Dir is its directory,
	// against which relative paths in the recipe are resolved. Not YAML.
	Path string `yaml:"-"`
	Dir  string `yaml:"-"`

	// pos remembers where each field was written (by field path, e.g.
	// "images[0].source"), so later checks such as CheckFiles can point at it.
	pos map[string]position
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

// Release is what a release owns on the node besides its images.
type Release struct {
	Files []ReleaseFile `yaml:"files,omitempty"`
}

// ReleaseFile is one file the release owns: written by the factory build
// through Ignition and replaced by an upgrade bundle (the node keeps the
// previous set for rollback).
type ReleaseFile struct {
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
