package contract

import (
	"bytes"
	"cmp"
	"fmt"

	"github.com/BurntSushi/toml"
)

// The node's main containers/storage store, where podman and CRI-O keep
// images by default (the preload's mode copy copies into it).
const (
	DefaultGraphRoot = "/var/lib/containers/storage"
	DefaultRunRoot   = "/run/containers/storage"
)

// StorageConfig is the node's containers/storage configuration
// (StorageConf), written by the factory in preload mode store to add the
// image partition's store (StorePath) to the node's. Zero fields take the
// distributions' defaults.
type StorageConfig struct {
	GraphRoot             string   // default DefaultGraphRoot
	RunRoot               string   // default DefaultRunRoot
	AdditionalImageStores []string // e.g. StorePath
}

// storageTOML is the part of storage.conf kiln writes.
type storageTOML struct {
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

// Render returns a complete storage.conf (StorageConf: podman and CRI-O
// both read it) using the overlay driver with c's stores.
//
// It is a whole file, not a drop-in: containers/storage before podman 6
// reads no storage.conf.d, and storage.conf files do not merge (the one in
// /etc replaces /usr/share/containers/storage.conf entirely), so the
// distribution's settings that matter are repeated here.
func (c StorageConfig) Render() []byte {
	var t storageTOML
	t.Storage.Driver = "overlay"
	t.Storage.GraphRoot = cmp.Or(c.GraphRoot, DefaultGraphRoot)
	t.Storage.RunRoot = cmp.Or(c.RunRoot, DefaultRunRoot)
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
