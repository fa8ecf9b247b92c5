// Package ignition renders the Ignition config kiln writes into the base
// image's boot partition: kiln's own units and files, the recipe's SSH keys,
// and the recipe's fragments merged in, validated by Ignition's own parser.
package ignition

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_3"
	types33 "github.com/coreos/ignition/v2/config/v3_3/types"
	"github.com/coreos/ignition/v2/config/v3_4"
	"github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/vcontext/report"
)

// DefaultVersion is the spec version kiln emits unless the recipe asks for
// another: the broadest support, and what Debian's ignition-validate accepts.
const DefaultVersion = "3.3.0"

// Versions lists the spec versions kiln can emit.
var Versions = []string{"3.3.0", "3.4.0", "3.5.0"}

// Unit is a systemd unit to install (and enable, if Enabled).
type Unit struct {
	Name     string
	Contents string
	Enabled  bool
}

// File is a file to write on the node.
type File struct {
	Path     string
	Mode     int // permission bits, e.g. 0o644
	Contents []byte
}

// Fragment is a user-supplied Ignition config to merge; Name is shown in errors.
type Fragment struct {
	Name string
	Data []byte
}

// Config is everything that goes into the rendered config.
type Config struct {
	Version   string // spec version; DefaultVersion when empty
	Units     []Unit
	Files     []File
	User      string // user that gets SSHKeys; "core" when empty
	SSHKeys   []string
	Fragments []Fragment
}

// Render returns the config as JSON, fragments merged in (kiln's entries are
// the parent; a fragment may add to or override them, as Ignition merges).
func Render(c Config) ([]byte, error) {
	version := c.Version
	if version == "" {
		version = DefaultVersion
	}
	base, err := json.Marshal(c.base())
	if err != nil {
		return nil, err
	}
	switch version {
	case "3.3.0":
		return mergeAll(base, c.Fragments, v3_3.ParseCompatibleVersion, v3_3.Merge, v3_3.Parse)
	case "3.4.0":
		return mergeAll(base, c.Fragments, v3_4.ParseCompatibleVersion, v3_4.Merge, v3_4.Parse)
	case "3.5.0":
		return mergeAll(base, c.Fragments, v3_5.ParseCompatibleVersion, v3_5.Merge, v3_5.Parse)
	}
	return nil, fmt.Errorf("ignition spec version %q is not supported: use one of %s", version, strings.Join(Versions, ", "))
}

// base builds kiln's own part of the config in spec 3.3.0, the oldest version
// kiln emits; newer versions are translated up by Ignition's own code.
func (c Config) base() types33.Config {
	var cfg types33.Config
	cfg.Ignition.Version = "3.3.0"
	units := append([]Unit(nil), c.Units...)
	sort.Slice(units, func(i, j int) bool { return units[i].Name < units[j].Name })
	for _, u := range units {
		u := u
		unit := types33.Unit{Name: u.Name, Contents: &u.Contents}
		if u.Enabled {
			unit.Enabled = boolPtr(true)
		}
		cfg.Systemd.Units = append(cfg.Systemd.Units, unit)
	}
	files := append([]File(nil), c.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		source := "data:;base64," + base64.StdEncoding.EncodeToString(f.Contents)
		mode := f.Mode
		cfg.Storage.Files = append(cfg.Storage.Files, types33.File{
			Node: types33.Node{Path: f.Path, Overwrite: boolPtr(true)},
			FileEmbedded1: types33.FileEmbedded1{
				Mode:     &mode,
				Contents: types33.Resource{Source: &source},
			},
		})
	}
	if len(c.SSHKeys) > 0 {
		user := c.User
		if user == "" {
			user = "core"
		}
		var keys []types33.SSHAuthorizedKey
		for _, k := range c.SSHKeys {
			keys = append(keys, types33.SSHAuthorizedKey(strings.TrimSpace(k)))
		}
		cfg.Passwd.Users = append(cfg.Passwd.Users, types33.PasswdUser{Name: user, SSHAuthorizedKeys: keys})
	}
	return cfg
}

// mergeAll parses the base and every fragment into one spec version (older
// fragments are translated up), merges them in order and validates the result.
func mergeAll[C any](base []byte, fragments []Fragment,
	parse func([]byte) (C, report.Report, error),
	merge func(C, C) C,
	validate func([]byte) (C, report.Report, error),
) ([]byte, error) {
	cfg, rpt, err := parse(base)
	if err != nil {
		return nil, fmt.Errorf("kiln's own ignition config is invalid (a kiln bug): %v: %s", err, rpt)
	}
	for _, f := range fragments {
		frag, rpt, err := parse(f.Data)
		if err != nil {
			return nil, fmt.Errorf("ignition fragment %s: %v%s", f.Name, err, reportSuffix(rpt))
		}
		cfg = merge(cfg, frag)
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if _, rpt, err := validate(out); err != nil {
		return nil, fmt.Errorf("merged ignition config is invalid: %v%s", err, reportSuffix(rpt))
	}
	return out, nil
}

func reportSuffix(r report.Report) string {
	if len(r.Entries) == 0 {
		return ""
	}
	return ":\n" + r.String()
}

func boolPtr(b bool) *bool { return &b }
