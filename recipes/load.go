package recipes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/crypto/ssh"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

const (
	// maxFileSize bounds what Load reads: recipes and locks are small, and the
	// bound turns "kiln build disk.raw" into a clear error, not a long read.
	maxFileSize = 1 << 20
	maxHeadroom = 1000 // percent
)

var (
	safeName    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	safeVersion = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)
	linuxUser   = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

// Load reads, decodes, defaults and validates the recipe at path. All
// problems found are returned together as an ErrorList, each with its
// FILE:LINE:COLUMN. Load does not look at the files the recipe names (base,
// fragments, oci/docker-archive sources); the builder calls CheckFiles for that.
func Load(path string) (*Recipe, error) {
	data, err := readSmallFile(path, "recipe")
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// readSmallFile reads a recipe or lock file, refusing anything over maxFileSize.
// A FIFO or a device given as one is refused, not waited on (inputfile).
func readSmallFile(path, what string) ([]byte, error) {
	data, err := inputfile.ReadFile(path, maxFileSize)
	var tooLarge *inputfile.TooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return nil, fmt.Errorf("%s: larger than 1 MiB, which no %s is; is this the right file?", path, what)
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return data, nil
}

// Parse is Load for a recipe already in memory; path is used for error
// messages and to set Path and Dir.
func Parse(path string, data []byte) (*Recipe, error) {
	d := newDocument(path)
	r := &Recipe{Path: path, Dir: filepath.Dir(path)}
	if abs, err := filepath.Abs(r.Dir); err == nil {
		r.Dir = abs
	}
	top := d.parse(data, `a recipe starts with "apiVersion: `+APIVersion+`"`)
	if top != nil && !d.wrongKind(top, KindLock, "this is a lock file, not a recipe; give kiln the recipe (.yaml) it belongs to") {
		d.decode(top, reflect.ValueOf(r).Elem(), "")
		r.pos = d.pos
		r.applyDefaults()
		r.validate(d)
	}
	if len(d.errs) > 0 {
		return nil, d.errs.sorted()
	}
	return r, nil
}

// applyDefaults fills every unset field with its default, so the builder and
// the docs see one explicit recipe.
func (r *Recipe) applyDefaults() {
	setDefault(&r.Arch, DefaultArch)
	if r.Disk.Size == (Size{}) {
		r.Disk.Size = Size{Auto: true}
	}
	p := &r.ImagePartition
	if p.Size == (Size{}) {
		p.Size = Size{Auto: true}
	}
	if p.Headroom == nil {
		p.Headroom = ptr(DefaultHeadroom)
	}
	setDefault(&p.Filesystem, DefaultFilesystem)
	setDefault(&p.Compression, DefaultCompression)
	setDefault(&p.Placement, DefaultPlacement)
	for i := range r.Images {
		img := &r.Images[i]
		if img.Serve == nil {
			img.Serve = ptr(defaultServe)
		}
		if img.Preload == nil {
			img.Preload = ptr(defaultPreload)
		}
	}
	if r.Registry.MirrorTags == nil {
		r.Registry.MirrorTags = ptr(defaultMirrorTags)
	}
	setDefault(&r.Preload.Mode, DefaultPreloadMode)
	setDefault(&r.Upgrade.Reboot, RebootCountdown)
	if r.Upgrade.Reboot == RebootCountdown {
		setDefault(&r.Upgrade.RebootDelay, DefaultRebootDelay)
	}
	setDefault(&r.Upgrade.Health.Timeout, DefaultHealthTimeout)
	setDefault(&r.Ignition.Version, DefaultIgnition)
	setDefault(&r.Ignition.User, DefaultUser)
	for i := range r.Release.Files {
		setDefault(&r.Release.Files[i].Mode, DefaultFileMode)
	}
}

func setDefault(s *string, def string) {
	if *s == "" {
		*s = def
	}
}

// validate checks values the types alone cannot. It runs even when decoding
// found problems, so one run reports everything; it skips fields that
// already have an error.
func (r *Recipe) validate(d *document) {
	v := validator{d}
	if v.required("apiVersion", r.APIVersion, `add "apiVersion: `+APIVersion+`"`) && r.APIVersion != APIVersion {
		v.errorf("apiVersion", "%q is not a version this kiln reads; use %q", r.APIVersion, APIVersion)
	}
	if v.required("kind", r.Kind, `add "kind: `+KindRecipe+`"`) && r.Kind != KindRecipe {
		v.errorf("kind", "%q: a recipe has \"kind: %s\"", r.Kind, KindRecipe)
	}
	if v.required("name", r.Name, `add a name such as "name: acme-edge"`) && !safeName.MatchString(r.Name) {
		v.errorf("name", "%q cannot be used in file names; use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. acme-edge)", r.Name)
	}
	if r.Version != "" && !safeVersion.MatchString(r.Version) {
		v.errorf("version", "%q cannot be used in file names; use letters, digits, '.', '_', '+' or '-' (e.g. 1.4.0)", r.Version)
	}
	v.oneOf("arch", r.Arch, Arches, map[string]string{"x86_64": "amd64", "x86-64": "amd64", "aarch64": "arm64", "arm64v8": "arm64"})

	// Whether the base exists is CheckFiles' business, when a build needs it.
	v.required("base.path", r.Base.Path, "set it to the raw base disk image, e.g. \"path: fedora-coreos.raw.xz\" under base:")
	if r.Base.Digest != "" {
		v.digest("base.digest", r.Base.Digest)
	}

	r.validateSizes(v)
	p := r.ImagePartition
	if h := p.HeadroomPercent(); h < 0 || h > maxHeadroom {
		v.errorf("imagePartition.headroom", "%d is out of range; give a percentage from 0 to %d", h, maxHeadroom)
	}
	if !p.Size.Auto && v.d.has("imagePartition.headroom") {
		v.errorf("imagePartition.headroom", "headroom only applies when imagePartition.size is auto; remove it or set size: auto")
	}
	v.oneOf("imagePartition.filesystem", p.Filesystem, Filesystems, nil)
	v.oneOf("imagePartition.compression", p.Compression, Compressions, map[string]string{"zst": "zstd", "gz": "gzip", "lzma": "xz", "off": "none", "false": "none"})
	v.oneOf("imagePartition.placement", p.Placement, Placements, map[string]string{"last": "end", "beforeRoot": "before-root", "before_root": "before-root"})

	r.validateImages(v)

	v.listen("registry.listen", &r.Registry.Listen)
	v.oneOf("preload.mode", r.Preload.Mode, PreloadModes, nil)

	ign := r.Ignition
	v.oneOf("ignition.version", ign.Version, IgnitionVersions, map[string]string{"3.3": "3.3.0", "3.4": "3.4.0"})
	for i, f := range ign.Fragments {
		v.required(fmt.Sprintf("ignition.fragments[%d]", i), f, "give the path of an Ignition config file, or remove the entry")
	}
	for i, k := range ign.SSHKeys {
		field := fmt.Sprintf("ignition.sshAuthorizedKeys[%d]", i)
		if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil || len(strings.TrimSpace(string(rest))) > 0 {
			v.errorf(field, "not one SSH public key (%s); paste a single whole line of a .pub file, e.g. ~/.ssh/id_ed25519.pub", abbreviate(k))
		}
	}
	if !linuxUser.MatchString(ign.User) {
		v.errorf("ignition.user", "%q is not a valid user name; use lower-case letters, digits, '_' or '-' (e.g. core)", ign.User)
	}
	r.validateRelease(v)
	r.validateUpgrade(v)
	r.validateReflash(v)
	if r.SecureBoot != nil || v.d.has("secureBoot") {
		sb := r.SecureBoot
		if sb == nil {
			sb = &SecureBoot{}
		}
		v.required("secureBoot.keys", sb.Keys, "give the directory `kiln key secureboot DIR` wrote (its db.crt and .auth files), e.g. \"keys: secureboot\" under secureBoot:")
	}
}

// minSector is the smallest sector a disk has: a disk size must be a
// whole number of them (of 4096 bytes on a 4Kn base; the build checks that).
const minSector = 512

// validateSizes refuses fixed sizes that no base and no content could
// make work; what depends on them (the base's partitions, the images, the
// node's kiln) is checked by the build as soon as it is known.
func (r *Recipe) validateSizes(v validator) {
	disk, part := r.Disk.Size, r.ImagePartition.Size
	if !disk.Auto && disk.Bytes%minSector != 0 {
		v.errorf("disk.size", "%s is not a whole number of %d-byte sectors; write it in MiB or GiB (e.g. %s)", disk, minSector, Size{Bytes: min(disk.Bytes>>20+1, 1<<42) << 20})
	}
	if !disk.Auto && !part.Auto && disk.Bytes <= part.Bytes {
		v.errorf("disk.size", "%s cannot hold imagePartition.size %s and the base's partitions; make disk.size larger than the image partition by the base's size, or write fit", disk, part)
	}
}

// validateReflash checks the reflash target rule: a /dev glob, a model
// glob, and size bounds that some disk can meet.
func (r *Recipe) validateReflash(v validator) {
	t := r.Reflash.Target
	if t.Path != "" {
		if _, err := filepath.Match(t.Path, ""); err != nil || !strings.HasPrefix(t.Path, "/dev/") {
			v.errorf("reflash.target.path", "%q is not a device path pattern; write e.g. /dev/disk/by-path/pci-0000:00:17.0-ata-1 or /dev/disk/by-id/nvme-*", t.Path)
		}
	}
	if _, err := filepath.Match(t.Model, ""); err != nil {
		v.errorf("reflash.target.model", "%q is not a valid pattern (%v); write e.g. \"Samsung SSD*\"", t.Model, err)
	}
	for _, s := range []struct {
		field string
		size  Size
	}{{"reflash.target.minSize", t.MinSize}, {"reflash.target.maxSize", t.MaxSize}} {
		if s.size.Auto {
			v.errorf(s.field, "a disk size bound cannot be auto; give a size such as 100GiB, or remove it")
		}
	}
	if t.MaxSize.Bytes > 0 && t.MaxSize.Bytes < t.MinSize.Bytes {
		v.errorf("reflash.target.maxSize", "%s is smaller than minSize %s: no disk can match", t.MaxSize, t.MinSize)
	}
}

// unitSafe: what a unit's command line takes without quoting or specifier
// expansion (no quotes, %, $, backslashes).
var unitSafe = regexp.MustCompile(`^[A-Za-z0-9 *:,./~+-]+$`)

// unitName: a systemd unit name with its type suffix.
var unitName = regexp.MustCompile(`^[A-Za-z0-9:_.@-]+\.(service|socket|target|mount|timer|path|scope|slice|swap|device|automount)$`)

// validateUpgrade checks the reboot policy and its one setting, and the
// health check.
func (r *Recipe) validateUpgrade(v validator) {
	u := r.Upgrade
	h := u.Health
	for i, name := range h.Units {
		if !unitName.MatchString(name) {
			v.errorf(fmt.Sprintf("upgrade.health.units[%d]", i), "%q is not a systemd unit name; write it with its type, e.g. app.service", name)
		}
	}
	for i, arg := range h.Command {
		field := fmt.Sprintf("upgrade.health.command[%d]", i)
		switch {
		case i == 0 && !strings.HasPrefix(arg, "/"):
			v.errorf(field, "%q: give the program's absolute path, e.g. /usr/bin/curl (the command runs without a shell)", arg)
		case arg == "" || strings.ContainsAny(arg, "\"'%$\\\n"):
			v.errorf(field, "%q: an argument may not be empty or hold quotes, %%, $ or backslashes (the command runs without a shell; put anything more in a script)", arg)
		}
	}
	if d, err := time.ParseDuration(h.Timeout); err != nil || d <= 0 || d > time.Hour {
		v.errorf("upgrade.health.timeout", "%q is not a duration from 1s to 1h; write e.g. 5m", h.Timeout)
	}
	if v.d.has("upgrade.health.unhealthyExitCode") {
		switch {
		case len(h.Command) == 0:
			v.errorf("upgrade.health.unhealthyExitCode", "only applies with a command (upgrade.health.command); add one or remove it")
		case h.UnhealthyExitCode < 1 || h.UnhealthyExitCode > 255:
			v.errorf("upgrade.health.unhealthyExitCode", "%d is not an exit status from 1 to 255 (0 means healthy)", h.UnhealthyExitCode)
		}
	}
	v.oneOf("upgrade.reboot", u.Reboot, RebootPolicies, map[string]string{"timer": RebootCountdown, "manual": RebootCommand, "never": RebootCommand, "maintenance": RebootWindow})
	if u.Reboot != RebootCountdown && v.d.has("upgrade.rebootDelay") {
		v.errorf("upgrade.rebootDelay", "only applies with reboot: %s; remove it", RebootCountdown)
	}
	if u.Reboot != RebootWindow && v.d.has("upgrade.rebootWindow") {
		v.errorf("upgrade.rebootWindow", "only applies with reboot: %s; remove it", RebootWindow)
	}
	if u.Reboot == RebootCountdown {
		if d, err := time.ParseDuration(u.RebootDelay); err != nil || d < 0 || d%time.Minute != 0 || d > 24*time.Hour {
			v.errorf("upgrade.rebootDelay", "%q is not a whole number of minutes up to 24h; write e.g. 1m, 5m or 0m", u.RebootDelay)
		}
	}
	if u.Reboot == RebootWindow && v.required("upgrade.rebootWindow", u.RebootWindow, `give a systemd calendar event, e.g. "Sun *-*-* 03:00:00" (systemd.time(7))`) {
		if !unitSafe.MatchString(u.RebootWindow) {
			v.errorf("upgrade.rebootWindow", "%q: a calendar event is letters, digits, spaces and * : , . / ~ + - only, e.g. \"Sun *-*-* 03:00:00\"", u.RebootWindow)
		} else if err := checkCalendar(u.RebootWindow); err != nil {
			v.errorf("upgrade.rebootWindow", "%v", err)
		}
	}
}

// checkCalendar asks systemd whether it parses the calendar event: a window
// the node's timer cannot parse would leave a staged release waiting for a
// reboot that never comes. systemd's own parser is the judge, not a copy.
func checkCalendar(event string) error {
	out, err := exec.Command("systemd-analyze", "calendar", "--", event).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit):
		return fmt.Errorf("%q is not a calendar event systemd can parse (%s); write e.g. \"Sun *-*-* 03:00:00\" or \"Mon..Fri 02:30\" (systemd.time(7))", event, strings.TrimSpace(string(out)))
	default:
		return fmt.Errorf("%q cannot be checked: %v (kiln needs systemd-analyze, Debian package systemd)", event, err)
	}
}

// validateRelease checks trust and release files. A recipe that trusts
// keys takes upgrade bundles, which are ordered by semver.
func (r *Recipe) validateRelease(v validator) {
	for i, k := range r.Trust {
		v.required(fmt.Sprintf("trust[%d]", i), k, "give the path of a public key file (kiln key generate writes NAME.pub), or remove the entry")
	}
	if len(r.Trust) > 0 {
		if v.required("version", r.Version, `a recipe with trust keys takes upgrade bundles, which need a semver version: add e.g. "version: 1.0.0"`) {
			if _, err := contract.ParseVersion(r.Version); err != nil {
				v.errorf("version", "%v; upgrade bundles (trust is set) order releases by semver", err)
			}
		}
	}
	seen := map[string]string{}
	for i, f := range r.Release.Files {
		field := fmt.Sprintf("release.files[%d]", i)
		if v.required(field+".path", f.Path, "give the file's absolute path on the node, e.g. /etc/containers/systemd/app.container") {
			if err := contract.CheckReleasePath(f.Path); err != nil {
				v.errorf(field+".path", "%v", err)
			} else if prev, dup := seen[f.Path]; dup {
				v.errorf(field+".path", "%q is listed twice (also at %s); keep one entry", f.Path, prev)
			} else {
				seen[f.Path] = field
			}
		}
		v.required(field+".source", f.Source, "give the file holding its content, relative to the recipe")
		if n, err := strconv.ParseUint(f.Mode, 8, 32); err != nil || n > 0o777 {
			v.errorf(field+".mode", "%q is not an octal permission such as \"0644\" or \"0600\"", f.Mode)
		}
	}
}

func (r *Recipe) validateImages(v validator) {
	if len(r.Images) == 0 {
		v.errorf("images", "no images; list at least one, e.g. \"images:\\n  - name: quay.io/acme/app:1.2\"")
		return
	}
	first := map[string]string{} // normalized name → field of its first use
	for i, img := range r.Images {
		field := fmt.Sprintf("images[%d]", i)
		if v.required(field+".name", img.Name, "add the reference workloads use, e.g. \"name: quay.io/acme/app:1.2\"") {
			ref, err := parseImageName(img.Name)
			if err != nil {
				v.errorf(field+".name", "%q %v", img.Name, err)
			} else if prev, dup := first[ref.Name()]; dup {
				v.errorf(field+".name", "%q is listed twice (also at %s, line %d); keep one entry", img.Name, prev, v.d.lookup(prev).line)
			} else {
				first[ref.Name()] = field + ".name"
			}
		}
		if img.Source != "" {
			if _, err := ParseSource(img.Source); err != nil {
				v.errorf(field+".source", "%v", err)
			}
		}
		if !img.Served() && !img.Preloaded() {
			v.errorf(field, "image %q is neither served nor preloaded, so it would not be on the appliance; set serve: true or preload: true", img.Name)
		}
	}
}

// badReference explains the distribution reference grammar, whose own
// error is only "invalid reference format".
const badReference = `is not a valid image reference (invalid reference format): write REGISTRY/PATH:TAG, ` +
	`where REGISTRY is a host name with an optional :PORT (e.g. quay.io or registry.local:5000) and PATH is ` +
	`lower-case letters and digits, separated by '.', '_', '__' or '-', in components joined by single '/' ` +
	`(no empty, "." or ".." components)`

// parseImageName parses a recipe image name strictly: registry, full
// repository path and a tag or digest all written out, since the node's
// registry serves and CRI-O pins images by exactly that name. Its errors
// read after the quoted name: "nginx" has no tag or digest….
func parseImageName(s string) (name.Reference, error) {
	weak, err := name.ParseReference(s)
	if err != nil {
		// ParseReference only says "could not parse reference"; ask the
		// parser that applies for the reason.
		if strings.Contains(s, "@") {
			_, err = name.NewDigest(s)
		} else {
			_, err = name.NewTag(s)
		}
		return nil, fmt.Errorf("is not a valid image reference: %v", err)
	}
	// go-containerregistry lets path components such as "..", "." and ""
	// through; the distribution grammar, which the node's registry, CRI-O
	// and podman parse names with, does not (contract.ParseReference).
	if _, err := contract.ParseReference(s); err != nil {
		return nil, errors.New(badReference)
	}
	if ref, err := name.ParseReference(s, name.StrictValidation); err == nil {
		return ref, nil
	}
	repo := weak.Context()
	registry := repo.RegistryStr()
	if registry == name.DefaultRegistry {
		registry = "docker.io"
	}
	full := registry + "/" + repo.RepositoryStr()
	lastPart := s[strings.LastIndex(s, "/")+1:]
	if !strings.ContainsAny(lastPart, ":@") {
		return nil, fmt.Errorf("has no tag or digest (kiln never assumes :latest); write it in full, e.g. %s:TAG", full)
	}
	if d, ok := weak.(name.Digest); ok {
		full += "@" + d.DigestStr()
	} else {
		full += ":" + weak.Identifier()
	}
	return nil, fmt.Errorf("is short for %s; write it in full, as workloads will pull it", full)
}

// validator adds checks with consistent wording to a document.
type validator struct{ d *document }

// ok reports whether field has no problem recorded yet, so a wrong-type
// error is not followed by a second, confusing one for the same field.
func (v validator) ok(field string) bool {
	within := func(inner, outer string) bool {
		return inner == outer || strings.HasPrefix(inner, outer+".") || strings.HasPrefix(inner, outer+"[")
	}
	for _, e := range v.d.errs {
		if within(e.Field, field) || (e.Field != "" && within(field, e.Field)) {
			return false
		}
	}
	return true
}

func (v validator) errorf(field, format string, args ...any) {
	if v.ok(field) {
		v.d.errorf(field, format, args...)
	}
}

// required checks that a string field is present and not empty.
func (v validator) required(field, value, hint string) bool {
	switch {
	case value != "":
		return true
	case !v.d.has(field):
		v.errorf(field, "required field is missing; %s", hint)
	default:
		v.errorf(field, "is empty; %s", hint)
	}
	return false
}

// oneOf checks an enumerated field; aliases maps common other spellings to
// the one kiln uses, for the hint.
func (v validator) oneOf(field, value string, valid []string, aliases map[string]string) {
	if slices.Contains(valid, value) {
		return
	}
	if alt, ok := aliases[strings.ToLower(value)]; ok {
		v.errorf(field, "%q is not supported; write %q", value, alt)
		return
	}
	for _, ok := range valid {
		if strings.EqualFold(ok, value) {
			v.errorf(field, "%q is not supported; write %q (values are case-sensitive)", value, ok)
			return
		}
	}
	v.errorf(field, "%q is not supported; use one of %s", value, strings.Join(valid, ", "))
}

// digest checks a "sha256:<64 hex>" digest.
func (v validator) digest(field, value string) bool {
	h, err := v1.NewHash(value)
	if err != nil || h.Algorithm != "sha256" || h.String() != value {
		v.errorf(field, "%q is not a sha256 digest; write sha256: followed by 64 lower-case hex digits (as sha256sum prints them)", value)
		return false
	}
	return true
}

// listen sets the node registry's listen address (its default when
// unset) by the node's own rule, so an address the units would refuse
// fails here, at its line.
func (v validator) listen(field string, addr *string) {
	listen, err := contract.ListenAddress(*addr)
	if err != nil {
		v.errorf(field, "%v", err)
		return
	}
	*addr = listen
}

// abbreviate shortens a long value (an SSH key) for an error message.
func abbreviate(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 24 {
		s = s[:24] + "…"
	}
	return strconv.Quote(s)
}

// File is a file or directory a recipe names.
type File struct {
	Field string // where the recipe names it, e.g. "base.path"
	Path  string // resolved against the recipe's directory
	What  string // for messages: "base image", "Ignition fragment", …
	Dir   bool   // an OCI layout directory; else a regular file
}

// SecureBootFiles are the files of secureBoot.keys a build reads: the db
// certificate the boot files are signed for and the signed lists
// systemd-boot enrols, as `kiln key secureboot` names them; never a
// private key.
var SecureBootFiles = []string{"db.crt", "PK.auth", "KEK.auth", "db.auth"}

// keyFile is what a trusted key is called in messages (File.What).
const keyFile = "public key file"

// Files lists the files the recipe names, in recipe order: the base image,
// the Ignition fragments, the trusted keys, the release files, the Secure
// Boot files and the directories and archives of oci: and docker-archive:
// sources.
func (r *Recipe) Files() []File {
	var files []File
	add := func(field, p, what string, dir bool) {
		files = append(files, File{Field: field, Path: r.Resolve(p), What: what, Dir: dir})
	}
	if r.Base.Path != "" {
		add("base.path", r.Base.Path, "base image", false)
	}
	for i, f := range r.Ignition.Fragments {
		add(fmt.Sprintf("ignition.fragments[%d]", i), f, "Ignition fragment", false)
	}
	for i, k := range r.Trust {
		add(fmt.Sprintf("trust[%d]", i), k, keyFile, false)
	}
	for i, f := range r.Release.Files {
		add(fmt.Sprintf("release.files[%d].source", i), f.Source, "release file", false)
	}
	if sb := r.SecureBoot; sb != nil && sb.Keys != "" {
		for _, name := range SecureBootFiles {
			add("secureBoot.keys", filepath.Join(sb.Keys, name), "Secure Boot file", false)
		}
	}
	for i, img := range r.Images {
		src, err := ParseSource(img.EffectiveSource()) // Load has checked it
		switch {
		case err != nil:
		case src.Transport == TransportOCI:
			add(fmt.Sprintf("images[%d].source", i), src.Path, "OCI layout directory", true)
		case src.Transport == TransportDockerArchive:
			add(fmt.Sprintf("images[%d].source", i), src.Path, "docker archive", false)
		}
	}
	return files
}

// CheckFiles checks that the files the recipe names (Files) exist and are
// of the right kind, that trusted keys parse and that OCI layouts have
// their layout files. The builder calls it before a build; Load does not,
// so recipes can be checked (and examples tested) without their inputs.
func (r *Recipe) CheckFiles() error {
	d := newDocument(r.Path)
	if r.pos != nil {
		d.pos = r.pos
	}
	for _, f := range r.Files() {
		fi, err := os.Stat(f.Path)
		switch {
		case err != nil:
			d.errorf(f.Field, "%s %s: %v", f.What, f.Path, unwrapPathError(err))
			continue
		case f.Dir && !fi.IsDir():
			d.errorf(f.Field, "%s is not a directory; give the %s", f.Path, f.What)
			continue
		case !f.Dir && !fi.Mode().IsRegular():
			d.errorf(f.Field, "%s is not a regular file; give the %s", f.Path, f.What)
			continue
		}
		switch {
		case f.What == keyFile:
			if data, err := inputfile.ReadFile(f.Path, maxFileSize); err != nil {
				d.errorf(f.Field, "%v", err)
			} else if _, err := bundlefmt.ParsePublicKey(data); err != nil {
				d.errorf(f.Field, "%s: %v", f.Path, err)
			}
		case f.Dir:
			for _, name := range []string{"oci-layout", "index.json"} {
				err := inputfile.Check(filepath.Join(f.Path, name))
				switch {
				case errors.Is(err, fs.ErrNotExist):
					d.errorf(f.Field, "%s has no %s file, so it is not an OCI image layout (make one with: skopeo copy docker://REF oci:DIR:TAG)", f.Path, name)
				case err != nil:
					d.errorf(f.Field, "%v", err)
				}
				if err != nil {
					break // one problem per layout
				}
			}
		}
	}
	if len(d.errs) > 0 {
		return d.errs.sorted()
	}
	return nil
}

// unwrapPathError drops the *PathError's repeated path, leaving e.g. "no such file or directory".
func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
