// Package preload is the node side of kiln's preloaded containers/storage
// store (the image partition's storage/ directory, built by builder/preload):
//
//   - mode "store" (default): StorageConf renders the storage.conf that
//     registers the store, read-only, as an additional image store of the
//     node's main store, for podman and CRI-O alike;
//   - mode "copy": CopyToMainStore copies every image of the store into the
//     node's main store at first boot, digests preserved.
package preloadcopy

import (
	"bytes"
	"fmt"

	"github.com/BurntSushi/toml"
)

// Paths on the node.
const (
	// StorePath is the preloaded store: the image partition (mounted at
	// /var/lib/kiln/images) holds it as storage/.
	StorePath = "/var/lib/kiln/images/storage"
	// StorageConfPath is the file StorageConf's output goes to.
	StorageConfPath = "/etc/containers/storage.conf"
	// The main store, where podman and CRI-O keep images by default.
	DefaultGraphRoot = "/var/lib/containers/storage"
	DefaultRunRoot   = "/run/containers/storage"
)

// Conf is the node's containers/storage configuration. Zero fields take
// the distributions' defaults.
type Conf struct {
	GraphRoot             string   // default DefaultGraphRoot
	RunRoot               string   // default DefaultRunRoot
	AdditionalImageStores []string // e.g. StorePath
}

// tomlConf is the part of storage.conf kiln writes.
type tomlConf struct {
	Storage struct {
		Driver    string `toml:"driver"`
		RunRoot   string `toml:"runroot"`
		GraphRoot string `toml:"graphroot"`
		Options   struct {
			AdditionalImageStores []string `toml:"additionalimagestores"`
			Overlay               struct {
				MountOpt string `toml:"mountopt"`
			} `toml:"overlay"`
		} `toml:"options"`
	} `toml:"storage"`
}

// StorageConf renders a complete /etc/containers/storage.conf (podman and
// CRI-O both read it) using the overlay driver with c's stores.
//
// It is a whole file, not a drop-in: containers/storage before podman 6
// reads no storage.conf.d, and storage.conf files do not merge (the one in
// /etc replaces /usr/share/containers/storage.conf entirely), so the
// distribution's settings that matter are repeated here.
func StorageConf(c Conf) []byte {
	var t tomlConf
	t.Storage.Driver = "overlay"
	t.Storage.GraphRoot = or(c.GraphRoot, DefaultGraphRoot)
	t.Storage.RunRoot = or(c.RunRoot, DefaultRunRoot)
	t.Storage.Options.AdditionalImageStores = append([]string{}, c.AdditionalImageStores...)
	t.Storage.Options.Overlay.MountOpt = "nodev" // as Fedora, RHEL and Debian ship it
	var b bytes.Buffer
	b.WriteString("# Written by kiln. A whole storage.conf: containers/storage reads one file\n" +
		"# and merges nothing, so this replaces /usr/share/containers/storage.conf.\n" +
		"# additionalimagestores: kiln's preloaded images, read-only, from the image partition.\n")
	if err := toml.NewEncoder(&b).Encode(t); err != nil {
		panic(fmt.Sprintf("encode storage.conf: %v", err)) // only strings: cannot fail
	}
	return b.Bytes()
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
