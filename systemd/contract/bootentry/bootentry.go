// Package bootentry is the boot loader entry of a release: a Boot Loader
// Specification type #1 entry on the ESP (loader/entries/ID.conf), named
// with a boot counter while the release is tried, as systemd-boot and
// systemd-bless-boot count them. The factory writes the first release's
// entry; the node writes each new release's with tries left, and
// systemd-bless-boot renames it to ID.conf once boot-complete.target is
// reached. A release whose tries run out sorts last and systemd-boot boots
// the next one by itself (docs/decisions.md: both proven in QEMU).
//
// File names:
//
//	kiln-1.1.0.conf        blessed (or never counted)
//	kiln-1.1.0+3.conf      3 tries left, none done
//	kiln-1.1.0+2-1.conf    2 left, 1 done (systemd-boot renames it as it boots it)
//	kiln-1.1.0+0-3.conf    bad: no tries left; sorted last, never booted by default
package bootentry

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Dir is where entries live, relative to the ESP's root.
const Dir = "loader/entries"

// FileDir holds, on the ESP, the kernels and initramfs images the node
// copies for the releases it installs, each named by its sha256: two
// releases booting the same file share it, a name always means the same
// bytes, and `kiln verify --booted` checks each against its name.
const FileDir = "kiln/sha256"

// FilePath is the ESP path (as an entry names it) of the boot file with
// digest d ("sha256:HEX").
func FilePath(d string) string { return "/" + FileDir + "/" + strings.TrimPrefix(d, "sha256:") }

// Suffix ends every type #1 entry's file name.
const Suffix = ".conf"

// UKIDir holds the type #2 entries, relative to the ESP's root: signed
// unified kernel images (a Secure Boot node's), one file each, counted in
// their names as type #1 entries are (kiln-1.1.0+3.efi): systemd-boot
// parses the counter of both alike, and its LoaderEntrySelected is the
// file name.
const UKIDir = "EFI/Linux"

// UKISuffix ends every type #2 entry's file name.
const UKISuffix = ".efi"

// DefaultTries is how many boots a new release gets before systemd-boot
// falls back: one for a power cut during the first, one for a second look.
const DefaultTries = 3

// Entry is what a release's entry says.
type Entry struct {
	ID      string   // the file name without counter and Suffix, e.g. "kiln-1.1.0"
	Title   string   // shown in the menu
	Version string   // the release's version: systemd-boot boots the highest first
	Linux   string   // the kernel's path on the ESP, e.g. "/kiln/1.1.0/vmlinuz"
	Initrd  []string // initramfs paths on the ESP
	Options []string // the kernel command line, one parameter each
}

// idPattern: what a file name may carry on every ESP (no '+', which starts
// the counter; no '/', no space).
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckID says whether id can name an entry.
func CheckID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("boot entry ID %q: want letters, digits, '.', '_' and '-' (at most 128)", id)
	}
	return nil
}

// Check says whether the entry can be written as it is.
func (e *Entry) Check() error {
	if err := CheckID(e.ID); err != nil {
		return err
	}
	if e.Linux == "" {
		return fmt.Errorf("boot entry %s: no kernel", e.ID)
	}
	for _, p := range append([]string{e.Linux}, e.Initrd...) {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " \t\n\\") || strings.Contains(p, "..") {
			return fmt.Errorf("boot entry %s: path %q must be absolute on the ESP, with no spaces, backslashes or '..'", e.ID, p)
		}
	}
	for _, s := range append([]string{e.Title, e.Version}, e.Options...) {
		if strings.ContainsAny(s, "\n\r") {
			return fmt.Errorf("boot entry %s: %q spans lines", e.ID, s)
		}
	}
	for _, o := range e.Options {
		if o == "" || strings.ContainsAny(o, " \t") {
			return fmt.Errorf("boot entry %s: kernel parameter %q is empty or holds a space", e.ID, o)
		}
	}
	return nil
}

// Encode writes the entry's text.
func (e *Entry) Encode(w io.Writer) error {
	if err := e.Check(); err != nil {
		return err
	}
	var b strings.Builder
	line := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, "%s %s\n", k, v)
		}
	}
	line("title", e.Title)
	line("version", e.Version)
	line("linux", e.Linux)
	for _, i := range e.Initrd {
		line("initrd", i)
	}
	line("options", strings.Join(e.Options, " "))
	_, err := io.WriteString(w, b.String())
	return err
}

// MaxSize bounds an entry file Decode reads (systemd-boot's are a few
// hundred bytes).
const MaxSize = 64 << 10

// Decode reads the entry in the file named name (its ID comes from the name,
// counter removed) as systemd-boot does: one "key value" a line, '#'
// comments, every "initrd" kept in order, the "options" lines joined. Keys
// kiln does not use (machine-id, sort-key, devicetree, …) are skipped.
func Decode(name string, r io.Reader) (*Entry, error) {
	n, err := ParseFileName(name)
	if err != nil {
		return nil, err
	}
	if n.UKI {
		return nil, fmt.Errorf("%q is a unified kernel image, not a text entry: %w", name, ErrNotEntry)
	}
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("boot entry %s: %w", name, err)
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("boot entry %s: larger than %d bytes", name, MaxSize)
	}
	e := &Entry{ID: n.ID}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v := line, ""
		if i := strings.IndexAny(line, " \t"); i >= 0 {
			k, v = line[:i], strings.TrimSpace(line[i+1:])
		}
		switch k {
		case "title":
			e.Title = v
		case "version":
			e.Version = v
		case "linux":
			e.Linux = v
		case "initrd":
			e.Initrd = append(e.Initrd, v)
		case "options":
			e.Options = append(e.Options, strings.Fields(v)...)
		}
	}
	return e, nil
}

// Name is an entry's file name taken apart.
type Name struct {
	ID         string
	Counting   bool // the name carries a counter
	Left, Done int
	UKI        bool // a type #2 entry (UKIDir, UKISuffix)
}

// FileName is the name of an entry with tries left (0: blessed, no counter).
func FileName(id string, triesLeft int) string {
	return Name{ID: id, Counting: triesLeft > 0, Left: max(triesLeft, 0)}.String()
}

// UKIFileName is FileName for a type #2 entry.
func UKIFileName(id string, triesLeft int) string {
	return Name{ID: id, Counting: triesLeft > 0, Left: max(triesLeft, 0), UKI: true}.String()
}

// String is the file name.
func (n Name) String() string {
	suffix := Suffix
	if n.UKI {
		suffix = UKISuffix
	}
	if !n.Counting {
		return n.ID + suffix
	}
	s := n.ID + "+" + strconv.Itoa(n.Left)
	if n.Done > 0 {
		s += "-" + strconv.Itoa(n.Done)
	}
	return s + suffix
}

// Path is the entry file's path relative to the ESP's root.
func (n Name) Path() string {
	if n.UKI {
		return UKIDir + "/" + n.String()
	}
	return Dir + "/" + n.String()
}

// Bad says systemd-boot will not boot it by default any more.
func (n Name) Bad() bool { return n.Counting && n.Left == 0 }

// ErrNotEntry is returned for a file name that is not an entry's.
var ErrNotEntry = errors.New("not a boot loader entry")

// ParseFileName takes an entry's file name apart as systemd-boot does: the
// counter is the last '+' and what follows it up to Suffix (type #1) or
// UKISuffix (type #2), LEFT or LEFT-DONE in decimal.
func ParseFileName(name string) (Name, error) {
	base, ok := strings.CutSuffix(name, Suffix)
	uki := false
	if !ok {
		base, uki = strings.CutSuffix(name, UKISuffix)
	}
	if !ok && !uki || base == "" {
		return Name{}, fmt.Errorf("%q: %w", name, ErrNotEntry)
	}
	i := strings.LastIndexByte(base, '+')
	if i < 0 {
		return Name{ID: base, UKI: uki}, nil
	}
	n := Name{ID: base[:i], Counting: true, UKI: uki}
	left, done, hasDone := strings.Cut(base[i+1:], "-")
	var err error
	if n.Left, err = counter(left); err != nil {
		return Name{}, fmt.Errorf("%q: tries left: %w", name, err)
	}
	if hasDone {
		if n.Done, err = counter(done); err != nil {
			return Name{}, fmt.Errorf("%q: tries done: %w", name, err)
		}
	}
	if n.ID == "" {
		return Name{}, fmt.Errorf("%q: %w", name, ErrNotEntry)
	}
	return n, nil
}

func counter(s string) (int, error) {
	if s == "" || len(s) > 4 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a small decimal number", s)
	}
	return strconv.Atoi(s)
}

// UsrVerity is a /usr slot opened by the initramfs against its root hash,
// with systemd's own parameters (systemd-veritysetup-generator,
// systemd-fstab-generator): nothing of kiln runs before /usr is checked.
type UsrVerity struct {
	RootHash     string // hex, from the signed manifest
	DataPartUUID string // the slot's partition
	HashPartUUID string // its verity partition
	FSType       string // e.g. "squashfs"
}

var (
	hexHash  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	partUUID = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	fsType   = regexp.MustCompile(`^[a-z0-9]{1,16}$`)
)

// Options are the kernel parameters that mount it.
func (u UsrVerity) Options() ([]string, error) {
	switch {
	case !hexHash.MatchString(u.RootHash):
		return nil, fmt.Errorf("usr verity root hash %q: want 64 lowercase hex digits (sha256)", u.RootHash)
	case !partUUID.MatchString(u.DataPartUUID) || !partUUID.MatchString(u.HashPartUUID):
		return nil, fmt.Errorf("usr partitions %q, %q: want partition UUIDs", u.DataPartUUID, u.HashPartUUID)
	case !fsType.MatchString(u.FSType):
		return nil, fmt.Errorf("usr filesystem type %q", u.FSType)
	}
	return []string{
		"mount.usr=/dev/mapper/usr",
		"mount.usrfstype=" + u.FSType,
		"mount.usrflags=ro",
		"usrhash=" + u.RootHash,
		"systemd.verity_usr_data=PARTUUID=" + strings.ToLower(u.DataPartUUID),
		"systemd.verity_usr_hash=PARTUUID=" + strings.ToLower(u.HashPartUUID),
	}, nil
}

// ParseUsrVerity finds the parameters Options writes in a command line:
// ok is false when none of them is there (an entry that does not mount a
// slot), an error names what is missing or malformed when only some are.
func ParseUsrVerity(options []string) (u UsrVerity, ok bool, err error) {
	for _, o := range options {
		k, v, _ := strings.Cut(o, "=")
		switch k {
		case "usrhash":
			u.RootHash, ok = v, true
		case "systemd.verity_usr_data":
			u.DataPartUUID, ok = strings.TrimPrefix(v, "PARTUUID="), true
		case "systemd.verity_usr_hash":
			u.HashPartUUID, ok = strings.TrimPrefix(v, "PARTUUID="), true
		case "mount.usrfstype":
			u.FSType = v
		}
	}
	if !ok {
		return UsrVerity{}, false, nil
	}
	if u.FSType == "" {
		u.FSType = "auto"
	}
	if _, err := u.Options(); err != nil {
		return UsrVerity{}, true, fmt.Errorf("%w (an entry that mounts /usr from a slot needs usrhash=, systemd.verity_usr_data=PARTUUID= and systemd.verity_usr_hash=PARTUUID=)", err)
	}
	u.DataPartUUID, u.HashPartUUID = strings.ToLower(u.DataPartUUID), strings.ToLower(u.HashPartUUID)
	return u, true, nil
}
