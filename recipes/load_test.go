package recipes

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// head is a valid recipe's first four lines; cases append to it, so their
// line numbers start at 5.
const head = `apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: acme
base: {path: base.raw}
`

// oneImage is lines 5-6 of a valid recipe.
// badRef is the reason given for a name outside the distribution grammar.
const badRef = badReference

const oneImage = `images:
  - name: quay.io/acme/app:1.2
`

func TestLoadExamples(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("examples/*.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("want at least two examples, got %v (%v)", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r, err := Load(f)
			if err != nil {
				t.Fatalf("Load:\n%v", err)
			}
			if r.Path != f || r.Dir != mustAbs(t, "examples") {
				t.Errorf("Path, Dir = %q, %q", r.Path, r.Dir)
			}
			if len(r.Images) == 0 {
				t.Error("no images")
			}
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	r, err := Parse("r.yaml", []byte(head+oneImage))
	if err != nil {
		t.Fatal(err)
	}
	want := &Recipe{
		APIVersion: APIVersion, Kind: KindRecipe, Name: "acme", Arch: "amd64",
		Base: Base{Path: "base.raw"},
		Disk: Disk{Size: Size{Auto: true}},
		ImagePartition: ImagePartition{
			Size: Size{Auto: true}, Headroom: ptr(10), Filesystem: "squashfs", Compression: "none", Placement: "auto",
		},
		Images:   []Image{{Name: "quay.io/acme/app:1.2", Serve: ptr(true), Preload: ptr(false)}},
		Registry: Registry{Listen: "127.0.0.1:5050", MirrorTags: ptr(true)},
		Preload:  Preload{Mode: "store"},
		Ignition: Ignition{Version: "3.3.0", User: "core"},
		Upgrade:  Upgrade{Reboot: "countdown", RebootDelay: "1m", Health: Health{Timeout: "5m"}},
		Path:     "r.yaml", Dir: mustAbs(t, "."),
	}
	r.pos = nil
	if !reflect.DeepEqual(r, want) {
		t.Errorf("got  %+v\nwant %+v", r, want)
	}
	// The accessors give the same defaults on a recipe built in code.
	var zero Recipe
	var img Image
	if zero.Platform() != "linux/amd64" || !img.Served() || img.Preloaded() ||
		!zero.Registry.MirrorsTags() || zero.ImagePartition.HeadroomPercent() != 10 {
		t.Error("accessor defaults differ from Load's")
	}
}

func TestAccessors(t *testing.T) {
	t.Parallel()
	r, err := Parse("r.yaml", []byte(head+`arch: arm64
imagePartition: {headroom: 0}
registry: {mirrorTags: false}
images:
  - name: quay.io/acme/app:1.2
    source: oci:layouts/app:1.2
    serve: false
    preload: true
  - name: quay.io/acme/db:3
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b := r.Images[0], r.Images[1]
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"Platform", r.Platform(), "linux/arm64"},
		{"HeadroomPercent", r.ImagePartition.HeadroomPercent(), 0},
		{"MirrorsTags", r.Registry.MirrorsTags(), false},
		{"a.Served", a.Served(), false},
		{"a.Preloaded", a.Preloaded(), true},
		{"a.EffectiveSource", a.EffectiveSource(), "oci:layouts/app:1.2"},
		{"b.EffectiveSource", b.EffectiveSource(), "docker://quay.io/acme/db:3"},
		{"b.Served", b.Served(), true},
		{"Resolve relative", r.Resolve("layouts/app"), filepath.Join(mustAbs(t, "."), "layouts/app")},
		{"Resolve absolute", r.Resolve("/srv/base.raw"), "/srv/base.raw"},
		{"Resolve empty", r.Resolve(""), ""},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

// An unhealthy exit code with a command is taken as given (no default).
func TestHealthUnhealthyExitCode(t *testing.T) {
	t.Parallel()
	r, err := Parse("r.yaml", []byte(head+oneImage+"upgrade: {health: {command: [/usr/libexec/app-health], unhealthyExitCode: 3}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Upgrade.Health.UnhealthyExitCode; got != 3 {
		t.Errorf("unhealthyExitCode = %d, want 3", got)
	}
}

// TestLoadErrors pins the exact message, with its position, for each class
// of bad input.
func TestLoadErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml, want string
	}{
		// The file itself.
		{"empty", ``, `r.yaml:1:1: the file is empty; a recipe starts with "apiVersion: kiln.dev/v1alpha1"`},
		{"comments only", "# nothing\n", `r.yaml:1:1: the file is empty; a recipe starts with "apiVersion: kiln.dev/v1alpha1"`},
		{"tab indent", head + "images:\n\t- name: x\n", `r.yaml:6: invalid YAML: found character that cannot start any token (a tab: indent YAML with spaces, not tabs)`},
		{"unclosed flow", head + "images: [\n", `r.yaml:5: invalid YAML: did not find expected node content`},
		{"two documents", head + oneImage + "---\n# more\nname: b\n", `r.yaml:9:1: a second YAML document (after a '---' line) starts here; the file must hold exactly one`},
		{"not a mapping", "- a\n- b\n", `r.yaml:1:1: expected a mapping of fields (apiVersion: …, kind: …), got a list`},
		{"alias", head + "images:\n  - &a {name: quay.io/acme/app:1.2}\n  - *a\n", `r.yaml:7:5: images[1]: YAML aliases (*a) are not supported here; write the value out in full`},

		// Fields.
		{"unknown field typo", head + oneImage + "imagePartiton: {}\n", `r.yaml:7:1: imagePartiton: unknown field; did you mean "imagePartition"?`},
		{"unknown field case", head + oneImage + "Registry: {}\n", `r.yaml:7:1: Registry: unknown field; did you mean "registry"? (field names are case-sensitive)`},
		{"unknown field far", head + oneImage + "registry: {port: 5000}\n", `r.yaml:7:12: registry.port: unknown field; valid fields here are alwaysOn, listen, mirrorTags`},
		{"unknown nested", head + "images:\n  - name: quay.io/acme/app:1.2\n    tag: x\n", `r.yaml:7:5: images[0].tag: unknown field; valid fields here are name, preload, serve, source`},
		{"merge key", head + oneImage + "registry:\n  <<: {}\n", `r.yaml:8:3: registry.<<: YAML merge keys (<<) are not supported; write the fields out in full`},
		{"duplicate field", head + oneImage + "name: other\n", `r.yaml:7:1: name: field given twice (first on line 3); keep one`},

		// Types.
		{"list for string", head + oneImage + "version: [1]\n", `r.yaml:7:10: version: expected a single value, got a list`},
		{"string for mapping", head + oneImage + "registry: on\n", `r.yaml:7:11: registry: expected a mapping (key: value lines), got "on"`},
		{"string for list", head + "images: quay.io/acme/app:1.2\n", `r.yaml:5:9: images: expected a list (one '- item' per line), got "quay.io/acme/app:1.2"`},
		{"yes for bool", head + "images:\n  - name: quay.io/acme/app:1.2\n    serve: yes\n", `r.yaml:7:12: images[0].serve: expected true or false, got "yes"`},
		{"string for int", head + oneImage + "imagePartition: {headroom: lots}\n", `r.yaml:7:28: imagePartition.headroom: expected a whole number, got "lots"`},
		{"float for int", head + oneImage + "imagePartition: {headroom: 2.5}\n", `r.yaml:7:28: imagePartition.headroom: expected a whole number, got "2.5"`},

		// Required.
		{"missing apiVersion", "kind: Appliance\nname: acme\nbase: {path: b}\n" + oneImage, `r.yaml:1:1: apiVersion: required field is missing; add "apiVersion: kiln.dev/v1alpha1"`},
		{"missing name", "apiVersion: kiln.dev/v1alpha1\nkind: Appliance\nbase: {path: b}\n" + oneImage, `r.yaml:1:1: name: required field is missing; add a name such as "name: acme-edge"`},
		{"empty name", "apiVersion: kiln.dev/v1alpha1\nkind: Appliance\nname:\nbase: {path: b}\n" + oneImage, `r.yaml:3:6: name: is empty; add a name such as "name: acme-edge"`},
		{"missing base path", "apiVersion: kiln.dev/v1alpha1\nkind: Appliance\nname: a\nbase: {digest: sha256:0000000000000000000000000000000000000000000000000000000000000000}\n" + oneImage, `r.yaml:4:7: base.path: required field is missing; set it to the raw base disk image, e.g. "path: fedora-coreos.raw.xz" under base:`},
		{"no images", head, `r.yaml:1:1: images: no images; list at least one, e.g. "images:\n  - name: quay.io/acme/app:1.2"`},
		{"image without name", head + "images:\n  - source: docker://quay.io/acme/app:1.2\n", `r.yaml:6:5: images[0].name: required field is missing; add the reference workloads use, e.g. "name: quay.io/acme/app:1.2"`},

		// Values.
		{"apiVersion", strings.Replace(head, "v1alpha1", "v1", 1) + oneImage, `r.yaml:1:13: apiVersion: "kiln.dev/v1" is not a version this kiln reads; use "kiln.dev/v1alpha1"`},
		{"kind lock", strings.Replace(head, "Appliance", "Lock", 1) + oneImage, `r.yaml:2:7: kind: this is a lock file, not a recipe; give kiln the recipe (.yaml) it belongs to`},
		{"kind other", strings.Replace(head, "Appliance", "Recipe", 1) + oneImage, `r.yaml:2:7: kind: "Recipe": a recipe has "kind: Appliance"`},
		{"unsafe name", strings.Replace(head, "acme", "../acme", 1) + oneImage, `r.yaml:3:7: name: "../acme" cannot be used in file names; use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. acme-edge)`},
		{"unsafe version", head + oneImage + "version: 1.0 beta\n", `r.yaml:7:10: version: "1.0 beta" cannot be used in file names; use letters, digits, '.', '_', '+' or '-' (e.g. 1.4.0)`},
		{"arch alias", head + oneImage + "arch: x86_64\n", `r.yaml:7:7: arch: "x86_64" is not supported; write "amd64"`},
		{"arch unknown", head + oneImage + "arch: riscv64\n", `r.yaml:7:7: arch: "riscv64" is not supported; use one of amd64, arm64`},
		{"base digest", strings.Replace(head, "base.raw}", "base.raw, digest: abc}", 1) + oneImage, `r.yaml:4:32: base.digest: "abc" is not a sha256 digest; write sha256: followed by 64 lower-case hex digits (as sha256sum prints them)`},
		{"headroom negative", head + oneImage + "imagePartition: {headroom: -5}\n", `r.yaml:7:28: imagePartition.headroom: -5 is out of range; give a percentage from 0 to 1000`},
		{"headroom with fixed size", head + oneImage + "imagePartition: {size: 4GiB, headroom: 5}\n", `r.yaml:7:40: imagePartition.headroom: headroom only applies when imagePartition.size is auto; remove it or set size: auto`},
		{"filesystem", head + oneImage + "imagePartition: {filesystem: ext4}\n", `r.yaml:7:30: imagePartition.filesystem: "ext4" is not supported; use one of squashfs`},
		{"compression case", head + oneImage + "imagePartition: {compression: ZSTD}\n", `r.yaml:7:31: imagePartition.compression: "ZSTD" is not supported; write "zstd" (values are case-sensitive)`},
		{"compression unknown", head + oneImage + "imagePartition: {compression: brotli}\n", `r.yaml:7:31: imagePartition.compression: "brotli" is not supported; use one of none, zstd, gzip, xz, lz4`},
		{"image name short", head + "images:\n  - name: nginx\n", `r.yaml:6:11: images[0].name: "nginx" has no tag or digest (kiln never assumes :latest); write it in full, e.g. docker.io/library/nginx:TAG`},
		{"image name implicit registry", head + "images:\n  - name: nginx:1.27\n", `r.yaml:6:11: images[0].name: "nginx:1.27" is short for docker.io/library/nginx:1.27; write it in full, as workloads will pull it`},
		{"image name implicit library", head + "images:\n  - name: docker.io/nginx@sha256:4032c6d5bfd752342c3e631c2f1de93ba6b86c41db6b167b9a35372c139e7706\n", `r.yaml:6:11: images[0].name: "docker.io/nginx@sha256:4032c6d5bfd752342c3e631c2f1de93ba6b86c41db6b167b9a35372c139e7706" is short for docker.io/library/nginx@sha256:4032c6d5bfd752342c3e631c2f1de93ba6b86c41db6b167b9a35372c139e7706; write it in full, as workloads will pull it`},
		{"image name no tag", head + "images:\n  - name: quay.io/acme/app\n", `r.yaml:6:11: images[0].name: "quay.io/acme/app" has no tag or digest (kiln never assumes :latest); write it in full, e.g. quay.io/acme/app:TAG`},
		{"image name upper case", head + "images:\n  - name: quay.io/Acme/app:1\n", "r.yaml:6:11: images[0].name: \"quay.io/Acme/app:1\" is not a valid image reference: repository can only contain the characters `abcdefghijklmnopqrstuvwxyz0123456789_-./`: Acme/app"},
		{"image name bad digest", head + "images:\n  - name: quay.io/acme/app@sha256:abc\n", `r.yaml:6:11: images[0].name: "quay.io/acme/app@sha256:abc" is not a valid image reference: invalid checksum digest length: sha256:abc`},
		// The distribution grammar the node's registry and CRI-O use: go-containerregistry alone lets these by.
		{"image name dot-dot path", head + "images:\n  - name: quay.io/../../etc/passwd:1.0\n", `r.yaml:6:11: images[0].name: "quay.io/../../etc/passwd:1.0" ` + badRef},
		{"image name empty component", head + "images:\n  - name: quay.io//x:1\n", `r.yaml:6:11: images[0].name: "quay.io//x:1" ` + badRef},
		{"image name dot component", head + "images:\n  - name: quay.io/./x:1\n", `r.yaml:6:11: images[0].name: "quay.io/./x:1" ` + badRef},
		{"image name dot-dot registry", head + "images:\n  - name: ..:5000/x:1\n", `r.yaml:6:11: images[0].name: "..:5000/x:1" ` + badRef},
		{"source dot-dot path", head + oneImage + "    source: docker://quay.io/../x:1\n", `r.yaml:7:13: images[0].source: source "docker://quay.io/../x:1": "quay.io/../x:1" ` + badRef},
		{"duplicate image", head + oneImage + "  - name: quay.io/acme/app:1.2\n    preload: true\n", `r.yaml:7:11: images[1].name: "quay.io/acme/app:1.2" is listed twice (also at images[0].name, line 6); keep one entry`},
		{"duplicate docker.io spelling", head + "images:\n  - name: docker.io/library/nginx:1\n  - name: index.docker.io/library/nginx:1\n", `r.yaml:7:11: images[1].name: "index.docker.io/library/nginx:1" is listed twice (also at images[0].name, line 6); keep one entry`},
		{"source no transport", head + oneImage + "    source: quay.io/acme/app:1.2\n", `r.yaml:7:13: images[0].source: source "quay.io/acme/app:1.2" has no transport; write docker://quay.io/acme/app:1.2 for a registry, oci:DIR[:TAG] for an OCI layout directory or docker-archive:FILE[:REF] for a docker save archive`},
		{"source unknown transport", head + oneImage + "    source: dir:/srv/app\n", `r.yaml:7:13: images[0].source: source "dir:/srv/app" has unknown transport "dir:"; kiln reads docker://, oci: and docker-archive:`},
		{"neither served nor preloaded", head + oneImage + "    serve: false\n", `r.yaml:6:5: images[0]: image "quay.io/acme/app:1.2" is neither served nor preloaded, so it would not be on the appliance; set serve: true or preload: true`},
		{"reboot policy unknown", head + oneImage + "upgrade: {reboot: manual}\n", `r.yaml:7:19: upgrade.reboot: "manual" is not supported; write "command"`},
		{"reboot policy other", head + oneImage + "upgrade: {reboot: later}\n", `r.yaml:7:19: upgrade.reboot: "later" is not supported; use one of countdown, window, command`},
		{"reboot delay not minutes", head + oneImage + "upgrade: {rebootDelay: 90s}\n", `r.yaml:7:24: upgrade.rebootDelay: "90s" is not a whole number of minutes up to 24h; write e.g. 1m, 5m or 0m`},
		{"reboot delay without countdown", head + oneImage + "upgrade: {reboot: command, rebootDelay: 5m}\n", `r.yaml:7:41: upgrade.rebootDelay: only applies with reboot: countdown; remove it`},
		{"window missing", head + oneImage + "upgrade: {reboot: window}\n", `r.yaml:7:10: upgrade.rebootWindow: required field is missing; give a systemd calendar event, e.g. "Sun *-*-* 03:00:00" (systemd.time(7))`},
		{"window with a quote", head + oneImage + "upgrade: {reboot: window, rebootWindow: 'Sun \"03:00'}\n", `r.yaml:7:41: upgrade.rebootWindow: "Sun \"03:00": a calendar event is letters, digits, spaces and * : , . / ~ + - only, e.g. "Sun *-*-* 03:00:00"`},
		{"window systemd cannot parse", head + oneImage + "upgrade: {reboot: window, rebootWindow: 'Sun 25:00'}\n", `r.yaml:7:41: upgrade.rebootWindow: "Sun 25:00" is not a calendar event systemd can parse (Failed to parse calendar specification 'Sun 25:00': Invalid argument); write e.g. "Sun *-*-* 03:00:00" or "Mon..Fri 02:30" (systemd.time(7))`},
		{"window without window policy", head + oneImage + "upgrade: {rebootWindow: 'Sun 03:00'}\n", `r.yaml:7:25: upgrade.rebootWindow: only applies with reboot: window; remove it`},
		{"reflash path not under /dev", head + oneImage + "reflash: {target: {path: 'disk/by-id/x'}}\n", `r.yaml:7:26: reflash.target.path: "disk/by-id/x" is not a device path pattern; write e.g. /dev/disk/by-path/pci-0000:00:17.0-ata-1 or /dev/disk/by-id/nvme-*`},
		{"reflash path bad glob", head + oneImage + "reflash: {target: {path: '/dev/sd[a'}}\n", `r.yaml:7:26: reflash.target.path: "/dev/sd[a" is not a device path pattern; write e.g. /dev/disk/by-path/pci-0000:00:17.0-ata-1 or /dev/disk/by-id/nvme-*`},
		{"reflash model bad glob", head + oneImage + "reflash: {target: {model: 'Sam[sung'}}\n", `r.yaml:7:27: reflash.target.model: "Sam[sung" is not a valid pattern (syntax error in pattern); write e.g. "Samsung SSD*"`},
		{"reflash size not a size", head + oneImage + "reflash: {target: {minSize: lots}}\n", `r.yaml:7:29: reflash.target.minSize: size "lots" is not a size; write "auto" or a whole number with a unit such as "8GiB"`},
		{"reflash size auto", head + oneImage + "reflash: {target: {maxSize: auto}}\n", `r.yaml:7:29: reflash.target.maxSize: a disk size bound cannot be auto; give a size such as 100GiB, or remove it`},
		{"reflash max below min", head + oneImage + "reflash: {target: {minSize: 100GiB, maxSize: 10GiB}}\n", `r.yaml:7:46: reflash.target.maxSize: 10GiB is smaller than minSize 100GiB: no disk can match`},
		{"secureBoot without keys", head + oneImage + "secureBoot: {}\n", `r.yaml:7:13: secureBoot.keys: required field is missing; give the directory ` + "`kiln key secureboot DIR`" + ` wrote (its db.crt and .auth files), e.g. "keys: secureboot" under secureBoot:`},
		{"secureBoot empty", head + oneImage + "secureBoot:\n", `r.yaml:7:12: secureBoot.keys: required field is missing; give the directory ` + "`kiln key secureboot DIR`" + ` wrote (its db.crt and .auth files), e.g. "keys: secureboot" under secureBoot:`},
		{"secureBoot unknown field", head + oneImage + "secureBoot: {db: db.crt}\n", "r.yaml:7:13: secureBoot.keys: required field is missing; give the directory `kiln key secureboot DIR` wrote (its db.crt and .auth files), e.g. \"keys: secureboot\" under secureBoot:\n" +
			"r.yaml:7:14: secureBoot.db: unknown field; valid fields here are keys"},
		{"reflash unattended not a bool", head + oneImage + "reflash: {unattended: sure}\n", `r.yaml:7:23: reflash.unattended: expected true or false, got "sure"`},
		{"health unit", head + oneImage + "upgrade: {health: {units: [app]}}\n", `r.yaml:7:28: upgrade.health.units[0]: "app" is not a systemd unit name; write it with its type, e.g. app.service`},
		{"health command relative", head + oneImage + "upgrade: {health: {command: [curl, -f]}}\n", `r.yaml:7:30: upgrade.health.command[0]: "curl": give the program's absolute path, e.g. /usr/bin/curl (the command runs without a shell)`},
		{"health command quote", head + oneImage + "upgrade: {health: {command: [/bin/sh, '$X']}}\n", `r.yaml:7:39: upgrade.health.command[1]: "$X": an argument may not be empty or hold quotes, %, $ or backslashes (the command runs without a shell; put anything more in a script)`},
		{"health timeout", head + oneImage + "upgrade: {health: {timeout: 2h}}\n", `r.yaml:7:29: upgrade.health.timeout: "2h" is not a duration from 1s to 1h; write e.g. 5m`},
		{"health unhealthyExitCode 0", head + oneImage + "upgrade: {health: {command: [/bin/true], unhealthyExitCode: 0}}\n", `r.yaml:7:61: upgrade.health.unhealthyExitCode: 0 is not an exit status from 1 to 255 (0 means healthy)`},
		{"health unhealthyExitCode 256", head + oneImage + "upgrade: {health: {command: [/bin/true], unhealthyExitCode: 256}}\n", `r.yaml:7:61: upgrade.health.unhealthyExitCode: 256 is not an exit status from 1 to 255 (0 means healthy)`},
		{"health unhealthyExitCode negative", head + oneImage + "upgrade: {health: {command: [/bin/true], unhealthyExitCode: -1}}\n", `r.yaml:7:61: upgrade.health.unhealthyExitCode: -1 is not an exit status from 1 to 255 (0 means healthy)`},
		{"health unhealthyExitCode not a number", head + oneImage + "upgrade: {health: {command: [/bin/true], unhealthyExitCode: three}}\n", `r.yaml:7:61: upgrade.health.unhealthyExitCode: expected a whole number, got "three"`},
		{"health unhealthyExitCode without command", head + oneImage + "upgrade: {health: {units: [app.service], unhealthyExitCode: 3}}\n", `r.yaml:7:61: upgrade.health.unhealthyExitCode: only applies with a command (upgrade.health.command); add one or remove it`},
		{"listen host name", head + oneImage + "registry: {listen: 'localhost:5050'}\n", `r.yaml:7:20: registry.listen: "localhost:5050": the host must be a loopback IP such as 127.0.0.1 (the node's registry is never exposed to the network)`},
		{"listen not loopback", head + oneImage + "registry: {listen: '10.0.0.1:5050'}\n", `r.yaml:7:20: registry.listen: "10.0.0.1:5050": the host must be a loopback IP such as 127.0.0.1 (the node's registry is never exposed to the network)`},
		{"listen privileged port", head + oneImage + "registry: {listen: '127.0.0.1:80'}\n", `r.yaml:7:20: registry.listen: "127.0.0.1:80": the port must be 1024-65535 (the registry runs without privileges)`},
		{"listen no port", head + oneImage + "registry: {listen: 127.0.0.1}\n", `r.yaml:7:20: registry.listen: "127.0.0.1" is not IP:PORT (e.g. 127.0.0.1:5050)`},
		{"listen bad port", head + oneImage + "registry: {listen: '[::1]:70000'}\n", `r.yaml:7:20: registry.listen: "[::1]:70000": the port must be 1024-65535 (the registry runs without privileges)`},
		{"preload mode", head + oneImage + "preload: {mode: overlay}\n", `r.yaml:7:17: preload.mode: "overlay" is not supported; use one of store, copy`},
		{"ignition version short", head + oneImage + "ignition: {version: 3.3}\n", `r.yaml:7:21: ignition.version: "3.3" is not supported; write "3.3.0"`},
		{"ignition version new", head + oneImage + "ignition: {version: 3.5.0}\n", `r.yaml:7:21: ignition.version: "3.5.0" is not supported; use one of 3.3.0, 3.4.0`},
		{"empty fragment", head + oneImage + "ignition:\n  fragments: ['']\n", `r.yaml:8:15: ignition.fragments[0]: is empty; give the path of an Ignition config file, or remove the entry`},
		{"ssh key truncated", head + oneImage + "ignition:\n  sshAuthorizedKeys: [ssh-ed25519 AAAAC3Nza]\n", `r.yaml:8:23: ignition.sshAuthorizedKeys[0]: not one SSH public key ("ssh-ed25519 AAAAC3Nza"); paste a single whole line of a .pub file, e.g. ~/.ssh/id_ed25519.pub`},
		{"user", head + oneImage + "ignition: {user: Admin}\n", `r.yaml:7:18: ignition.user: "Admin" is not a valid user name; use lower-case letters, digits, '_' or '-' (e.g. core)`},

		// Trust and release files.
		{"trust without semver", head + oneImage + "version: '1.0'\ntrust: [k.pub]\n", `r.yaml:7:10: version: version "1.0" is not semver: write MAJOR.MINOR.PATCH, e.g. 1.2.0 (or 1.2.0-rc.1); upgrade bundles (trust is set) order releases by semver`},
		{"trust without version", head + oneImage + "trust: [k.pub]\n", `r.yaml:1:1: version: required field is missing; a recipe with trust keys takes upgrade bundles, which need a semver version: add e.g. "version: 1.0.0"`},
		{"trust empty entry", head + oneImage + "version: 1.0.0\ntrust: ['']\n", `r.yaml:8:9: trust[0]: is empty; give the path of a public key file (kiln key generate writes NAME.pub), or remove the entry`},
		{"release path outside", head + oneImage + "release:\n  files:\n    - {path: /etc/passwd, source: p}\n", `r.yaml:9:14: release.files[0].path: "/etc/passwd" is outside the directories a release may own (/etc/containers/systemd/, /etc/kubernetes/manifests/, /etc/kiln/release/)`},
		{"release path dotdot", head + oneImage + "release:\n  files:\n    - {path: /etc/kiln/release/../../shadow, source: p}\n", `r.yaml:9:14: release.files[0].path: "/etc/kiln/release/../../shadow" is not a clean absolute path; write it like /etc/containers/systemd/app.container`},
		{"release path twice", head + oneImage + "release:\n  files:\n    - {path: /etc/kiln/release/a, source: p}\n    - {path: /etc/kiln/release/a, source: q}\n", `r.yaml:10:14: release.files[1].path: "/etc/kiln/release/a" is listed twice (also at release.files[0]); keep one entry`},
		{"release no source", head + oneImage + "release:\n  files:\n    - {path: /etc/kiln/release/a}\n", `r.yaml:9:7: release.files[0].source: required field is missing; give the file holding its content, relative to the recipe`},
		{"release mode", head + oneImage + "release:\n  files:\n    - {path: /etc/kiln/release/a, source: p, mode: '0999'}\n", `r.yaml:9:52: release.files[0].mode: "0999" is not an octal permission such as "0644" or "0600"`},

		// Sizes.
		{"size fraction", head + oneImage + "disk: {size: 1.5GiB}\n", `r.yaml:7:14: disk.size: size "1.5GiB": use a whole number with a smaller unit (e.g. 1536MiB, not 1.5GiB)`},
		{"size unit case", head + oneImage + "disk: {size: 8gib}\n", `r.yaml:7:14: disk.size: size "8gib" has unknown unit "gib"; did you mean "GiB"? (units are case-sensitive)`},
		{"size unit unknown", head + oneImage + "disk: {size: 8PB}\n", `r.yaml:7:14: disk.size: size "8PB" has unknown unit "PB"; use B, K, M, G, T or KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB (decimal)`},
		{"size zero", head + oneImage + "disk: {size: 0}\n", `r.yaml:7:14: disk.size: size "0" is zero; sizes must be greater than zero (or "auto")`},
		{"size negative", head + oneImage + "imagePartition: {size: -1G}\n", `r.yaml:7:24: imagePartition.size: size "-1G" is negative; sizes must be greater than zero`},
		{"size overflow", head + oneImage + "disk: {size: 9000000TiB}\n", `r.yaml:7:14: disk.size: size "9000000TiB" is too large`},
		{"size Auto", head + oneImage + "disk: {size: Auto}\n", `r.yaml:7:14: disk.size: size "Auto": write "auto" in lower case`},
		{"disk size not whole sectors", head + oneImage + "disk: {size: 1000000001}\n", `r.yaml:7:14: disk.size: 1000000001B is not a whole number of 512-byte sectors; write it in MiB or GiB (e.g. 954MiB)`},
		{"disk size no larger than the image partition", head + oneImage + "disk: {size: 4GiB}\nimagePartition: {size: 4GiB}\n", `r.yaml:7:14: disk.size: 4GiB cannot hold imagePartition.size 4GiB and the base's partitions; make disk.size larger than the image partition by the base's size, or write fit`},
		{"size list", head + oneImage + "disk: {size: [1]}\n", `r.yaml:7:14: disk.size: expected a size such as "8GiB" or "auto", got a list`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatalf("no error, want\n%s", c.want)
			}
			if err.Error() != c.want {
				t.Errorf("got\n%s\nwant\n%s", err, c.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "r.yaml" {
				t.Errorf("error is not an *Error for r.yaml: %#v", err)
			}
		})
	}
}

// TestLoadManyErrors checks that one run reports every problem, in file
// order, and no second error for a field that already has one.
// TestLoadAccepts covers YAML forms that must load.
func TestLoadAccepts(t *testing.T) {
	t.Parallel()
	for name, y := range map[string]string{
		"document markers": "---\n" + head + oneImage + "...\n",
		"trailing ---":     head + oneImage + "---\n# the end\n",
		"empty mappings":   head + oneImage + "registry:\npreload: {}\nignition:\n",
		"anchor, no alias": head + "images:\n  - &app {name: quay.io/acme/app:1.2}\n",
		"flow style":       `{apiVersion: kiln.dev/v1alpha1, kind: Appliance, name: a, base: {path: b}, images: [{name: "quay.io/a/b:1"}]}`,
		"explicit tags":    head + "images:\n  - name: !!str quay.io/acme/app:1.2\n    serve: !!bool true\n",
		"CRLF":             strings.ReplaceAll(head+oneImage, "\n", "\r\n"),
		"version number":   head + oneImage + "version: 1.10\n",
		"reboot window":    head + oneImage + "upgrade: {reboot: window, rebootWindow: 'Mon..Fri 02:30'}\n",
		"secure boot":      head + oneImage + "secureBoot: {keys: secureboot}\n",
	} {
		r, err := Parse("r.yaml", []byte(y))
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if name == "version number" && r.Version != "1.10" {
			t.Errorf("version = %q, want 1.10 as written", r.Version)
		}
	}
}

func TestLoadManyErrors(t *testing.T) {
	t.Parallel()
	_, err := Parse("r.yaml", []byte(`apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: [acme]
arch: x86_64
images:
  - name: nginx
    serve: yes
`))
	want := `r.yaml:1:1: base.path: required field is missing; set it to the raw base disk image, e.g. "path: fedora-coreos.raw.xz" under base:
r.yaml:3:7: name: expected a single value, got a list
r.yaml:4:7: arch: "x86_64" is not supported; write "amd64"
r.yaml:6:11: images[0].name: "nginx" has no tag or digest (kiln never assumes :latest); write it in full, e.g. docker.io/library/nginx:TAG
r.yaml:7:12: images[0].serve: expected true or false, got "yes"`
	if err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 5 {
		t.Errorf("want an ErrorList of 5, got %#v", err)
	}
}

func TestLoadFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(big, make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than 1 MiB") {
		t.Errorf("big file: %v", err)
	}
}

func TestCheckFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(p string) {
		t.Helper()
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	recipe := head + `ignition:
  fragments: [users.ign]
images:
  - name: quay.io/acme/app:1.2
    source: oci:layouts/app:1.2
  - name: quay.io/acme/db:3
    source: docker-archive:db.tar
  - name: quay.io/acme/cache:1
`
	path := filepath.Join(dir, "r.yaml")
	if err := os.WriteFile(path, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := path + `:4:14: base.path: base image ` + dir + `/base.raw: no such file or directory
` + path + `:6:15: ignition.fragments[0]: Ignition fragment ` + dir + `/users.ign: no such file or directory
` + path + `:9:13: images[0].source: OCI layout directory ` + dir + `/layouts/app: no such file or directory
` + path + `:11:13: images[1].source: docker archive ` + dir + `/db.tar: no such file or directory`
	if err := r.CheckFiles(); err == nil || err.Error() != want {
		t.Errorf("nothing there: got\n%v\nwant\n%s", err, want)
	}

	write("base.raw")
	write("users.ign")
	write("layouts/app/index.json")
	if err := os.Mkdir(filepath.Join(dir, "db.tar"), 0o755); err != nil {
		t.Fatal(err)
	}
	want = path + `:9:13: images[0].source: ` + dir + `/layouts/app has no oci-layout file, so it is not an OCI image layout (make one with: skopeo copy docker://REF oci:DIR:TAG)
` + path + `:11:13: images[1].source: ` + dir + `/db.tar is not a regular file; give the docker archive`
	if err := r.CheckFiles(); err == nil || err.Error() != want {
		t.Errorf("half there: got\n%v\nwant\n%s", err, want)
	}

	write("layouts/app/oci-layout")
	os.Remove(filepath.Join(dir, "db.tar"))
	write("db.tar")
	if err := r.CheckFiles(); err != nil {
		t.Errorf("all there: %v", err)
	}
}

// TestDocsListEveryField keeps docs/recipes.md in step with the types: every
// YAML field of a recipe has a row in its tables.
func TestDocsListEveryField(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/recipes.md")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		names, index := yamlFields(typ)
		for _, n := range names {
			if !strings.Contains(string(doc), "| `"+n+"` |") {
				t.Errorf("docs/recipes.md has no row for field %q of %s", n, typ.Name())
			}
			ft := typ.Field(index[n]).Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[Size]() {
				walk(ft)
			}
		}
	}
	walk(reflect.TypeFor[Recipe]())
}

// TestCheckFilesTrustAndRelease: trust keys must exist and be ed25519 public
// keys; release files must exist.
func TestCheckFilesTrustAndRelease(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "base.raw"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "bad.pub"), []byte("ssh-ed25519 AAAA\n"), 0o644)
	recipe := head + oneImage + "version: 1.0.0\ntrust: [bad.pub, gone.pub]\nrelease:\n  files:\n    - {path: /etc/kiln/release/a.conf, source: a.conf}\n"
	path := filepath.Join(dir, "r.yaml")
	os.WriteFile(path, []byte(recipe), 0o644)
	r, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	err = r.CheckFiles()
	want := []string{
		path + ":8:9: trust[0]: " + dir + "/bad.pub: not a PEM key file (make one with `kiln key generate`)",
		path + ":8:18: trust[1]: public key file " + dir + "/gone.pub: no such file or directory",
		path + ":11:48: release.files[0].source: release file " + dir + "/a.conf: no such file or directory",
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("got\n%v\nwant\n%s", err, strings.Join(want, "\n"))
	}
}
