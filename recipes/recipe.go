package recipes

import (
	"path/filepath"
	"strconv"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Defaults, applied by Load and assumed by the accessors when a field is unset.
const (
	DefaultArch        = "amd64"
	DefaultHeadroom    = 10
	DefaultFilesystem  = "squashfs"
	DefaultCompression = "none"
	DefaultPlacement   = contract.PlaceAuto
	DefaultPreloadMode = contract.PreloadStore
	// Reboot policies after an upgrade is staged.
	RebootCountdown      = "countdown"
	RebootWindow         = "window"
	RebootCommand        = "command"
	DefaultRebootDelay   = "1m"
	DefaultHealthTimeout = "5m"
	DefaultIgnition      = "3.3.0"
	DefaultUser          = "core"
	DefaultFileMode      = "0644"

	defaultServe      = true
	defaultPreload    = false
	defaultMirrorTags = true
)

// Values kiln accepts for the enumerated fields, in the order the docs list
// them. IgnitionVersions are the specs kiln emits: it renders 3.3.0 and
// translates up with Ignition's own code, so older specs cannot be emitted
// (older fragments are fine: they are translated up); 3.5.0 is left out
// until the target OSes read it.
var (
	Arches       = []string{"amd64", "arm64"}
	Filesystems  = []string{"squashfs"}
	Compressions = []string{"none", "zstd", "gzip", "xz", "lz4"}
	Placements   = contract.Placements
	PreloadModes = contract.PreloadModes
	// RebootPolicies are the values of upgrade.reboot, the default first.
	RebootPolicies   = []string{RebootCountdown, RebootWindow, RebootCommand}
	IgnitionVersions = []string{"3.3.0", "3.4.0"}
)

// Served reports whether the image goes into the OCI layout the node's
// registry serves (default true).
func (i Image) Served() bool {
	if i.Serve == nil {
		return defaultServe
	}
	return *i.Serve
}

// Preloaded reports whether the image goes into the preloaded
// containers/storage store (default false).
func (i Image) Preloaded() bool {
	if i.Preload == nil {
		return defaultPreload
	}
	return *i.Preload
}

// EffectiveSource is where the factory fetches the image from: Source, or
// the registry named by Name when Source is empty.
func (i Image) EffectiveSource() string {
	if i.Source == "" {
		return "docker://" + i.Name
	}
	return i.Source
}

// Platform is the OCI platform the appliance runs, e.g. "linux/amd64".
func (r *Recipe) Platform() string {
	arch := r.Arch
	if arch == "" {
		arch = DefaultArch
	}
	return "linux/" + arch
}

// MirrorsTags reports whether tag pulls go to the local registry too, not
// only digest pulls (default true).
func (r Registry) MirrorsTags() bool {
	if r.MirrorTags == nil {
		return defaultMirrorTags
	}
	return *r.MirrorTags
}

// VerityOn says whether the partition gets a dm-verity hash tree (the
// default) that the node opens it through.
func (p ImagePartition) VerityOn() bool { return p.Verity == nil || *p.Verity }

// HeadroomPercent is the space added to the content when Size is auto
// (default 10).
func (p ImagePartition) HeadroomPercent() int {
	if p.Headroom == nil {
		return DefaultHeadroom
	}
	return *p.Headroom
}

// Resolve makes a path from the recipe absolute: relative paths are taken
// relative to the recipe's directory; absolute and empty paths are returned
// as they are.
func (r *Recipe) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(r.Dir, p)
}

// Image finds the recipe's image with this name.
func (r *Recipe) Image(name string) (Image, bool) {
	for _, img := range r.Images {
		if img.Name == name {
			return img, true
		}
	}
	return Image{}, false
}

// FileMode is the file's permission bits (Mode, or DefaultFileMode).
func (f ReleaseFileSpec) FileMode() uint32 {
	m := f.Mode
	if m == "" {
		m = DefaultFileMode
	}
	n, _ := strconv.ParseUint(m, 8, 32) // validated by Load
	return uint32(n)
}

// Errorf is a problem with field (e.g. "disk.size") found after Load, placed
// where the recipe file says it: FILE:LINE:COLUMN.
func (r *Recipe) Errorf(field, format string, args ...any) *Error {
	d := newDocument(r.Path)
	if r.pos != nil {
		d.pos = r.pos
	}
	d.errorf(field, format, args...)
	return d.errs[0]
}

func ptr[T any](v T) *T { return &v }
