package builder

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/internal/hosttools"
	"github.com/kiln-appliance/kiln/internal/secureboot"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/esp"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// SecureBootTools are the host tools a Secure Boot build runs, besides
// the build's own.
var SecureBootTools = append(append([]string{}, uki.Tools...), "mcopy", "mdir", "mmd", "mdel")

// Where systemd-boot is on an ESP: its own place, and the removable-media
// fallback the firmware boots when no boot entry names a loader.
var systemdBootPaths = []string{"EFI/systemd/systemd-bootx64.efi", "EFI/BOOT/BOOTX64.EFI"}

// Paths on the ESP a Secure Boot build writes.
const (
	ukiDir = "EFI/Linux" // type #2 entries: systemd-boot lists every .efi here
	// keysDir is where systemd-boot enrols from without asking: with
	// secure-boot-enroll force it enrols only a directory named "auto"
	// (boot.c, 252 and later); any other one it offers as a menu entry.
	keysDir    = "loader/keys/auto"
	loaderConf = "loader/loader.conf"
)

// firstBootParam marks the one-shot first-boot entry: Ignition runs when
// the kernel command line has it.
const firstBootParam = "ignition.firstboot"

// enrollSetting makes systemd-boot enrol loader/keys/auto on a machine in
// setup mode without asking. systemd-boot 252 (Debian 12) reads off,
// manual and force; if-safe came in 253.
const enrollSetting = "secure-boot-enroll force"

// enrollSince is the first systemd-boot with secure-boot-enroll.
const enrollSince = 252

// SecureBootESP makes the ESP of a disk assembled from a recipe's base
// boot under Secure Boot: what PrepareSecureBootESP read, checked and
// signed before the long steps, for Write to put on the new disk's ESP
// once the image partition's identity is known. The factory build and
// kiln reflash-stick both use it, so the stick boots where the disk does.
type SecureBootESP struct {
	o          SecureBootESPOptions
	dir        string // temporary: the base's kernels, the signed loaders, the .auth copies, the UKIs
	cert       string // the db certificate
	entries    []ukiEntry
	loaders    []signedLoader
	auths      map[string]string // name (PK, KEK, db) → local copy
	loaderConf []byte            // loader.conf as it is to be
	remove     []string          // ESP files the UKIs replace: their entries, kernels and initramfs images
	record     *contract.SecureBoot
}

// SecureBootESPOptions configure PrepareSecureBootESP.
type SecureBootESPOptions struct {
	Key   string // the db private key (--secure-boot-key)
	What  string // the output, in messages: "disk", "reflash stick"
	Epoch int64  // the time of the files written on the ESP
	// NoImageVerity: the image partition has no dm-verity (a reflash
	// stick's, whose record's digests check every byte), so the UKIs carry
	// no image partition root hash. Without it Write refuses a partition
	// without one: a factory disk's UKIs must sign it.
	NoImageVerity bool
}

// ukiEntry is a boot loader entry of the base and the UKI that replaces it.
type ukiEntry struct {
	entry   *bootentry.Entry
	kernel  string   // local copy
	initrds []string // local copies
	uki     contract.UKI
}

type signedLoader struct{ path, signed string }

// prepareSecureBoot checks what a Secure Boot build needs before any long
// work (a recipe with image partition verity, a base with OS slots, and
// what PrepareSecureBootESP checks) and signs systemd-boot; the UKIs wait
// for the image partition's root hash (SecureBootESP.Write).
func (b *build) prepareSecureBoot(ctx context.Context) error {
	r := b.Recipe
	if err := CheckNoSecureBootKey(r, b.o.SecureBootKey); err != nil || r.SecureBoot == nil {
		return err
	}
	if !r.ImagePartition.VerityOn() {
		return r.Errorf("secureBoot", "a Secure Boot disk needs imagePartition.verity: the signed kernel command line carries the image partition's dm-verity root hash")
	}
	if b.osSlots == nil {
		return r.Errorf("secureBoot", "base image %s has no A/B OS slots (usr and usr-verity partitions): a Secure Boot disk boots signed unified kernel images of a release in a slot; build from a base with slots, or remove secureBoot", r.Resolve(r.Base.Path))
	}
	var err error
	b.secureBoot, err = PrepareSecureBootESP(ctx, r, SecureBootESPOptions{Key: b.o.SecureBootKey, What: "disk", Epoch: b.Epoch})
	return err
}

// CheckNoSecureBootKey refuses a --secure-boot-key for a recipe without
// secureBoot: nothing would be signed.
func CheckNoSecureBootKey(r *recipes.Recipe, key string) error {
	if r.SecureBoot == nil && key != "" {
		return fmt.Errorf("--secure-boot-key %s: recipe %s has no secureBoot section, so nothing is signed: add one naming the keys' directory, or drop --secure-boot-key", key, r.Path)
	}
	return nil
}

// PrepareSecureBootESP checks what Secure Boot signing for recipe r
// (which has secureBoot) needs before any long work (the tools, the key
// against the recipe's db certificate, a base whose entries mount an OS
// slot, systemd-boot), reads the base's entries and signs systemd-boot.
// Remove removes its temporary files.
func PrepareSecureBootESP(ctx context.Context, r *recipes.Recipe, o SecureBootESPOptions) (_ *SecureBootESP, err error) {
	keys := r.Resolve(r.SecureBoot.Keys)
	cert, err := CheckSecureBootKey(r, o.Key, o.What)
	if err != nil {
		return nil, err
	}
	basePath := r.Resolve(r.Base.Path)
	dir, err := os.MkdirTemp("", "kiln-secureboot-")
	if err != nil {
		return nil, err
	}
	sb := &SecureBootESP{o: o, dir: dir, cert: cert, auths: map[string]string{}}
	defer func() {
		if err != nil {
			sb.Remove()
		}
	}()
	d, err := base.OpenDisk(basePath, dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	refuse := func(err error) error { return r.Errorf("secureBoot", "base image %s: %v", basePath, err) }
	fs, err := espOf(d)
	if err != nil {
		return nil, refuse(err)
	}
	if err := sb.readEntries(fs); err != nil {
		return nil, refuse(err)
	}
	if err := sb.signLoaders(ctx, fs); err != nil {
		return nil, refuse(err)
	}
	conf, err := fs.Read(loaderConf, dir)
	if err != nil && !errors.Is(err, esp.ErrNotExist) {
		return nil, refuse(err)
	}
	var ids []string
	for _, e := range sb.entries {
		ids = append(ids, e.entry.ID)
	}
	sb.loaderConf = secureBootLoaderConf(conf, ids)
	for _, name := range secureboot.Names {
		local := filepath.Join(dir, name+".auth")
		if err := copyFile(secureboot.Auth(keys, name), local); err != nil {
			return nil, r.Errorf("secureBoot.keys", "%v: kiln key secureboot writes %s.auth beside db.crt", err, name)
		}
		sb.auths[name] = local
	}
	pemBytes, err := os.ReadFile(cert)
	if err != nil {
		return nil, err
	}
	sb.record = &contract.SecureBoot{DB: string(pemBytes), Keys: keysDir}
	for _, e := range sb.entries {
		sb.record.UKIs = append(sb.record.UKIs, e.uki)
	}
	for _, l := range sb.loaders {
		dg, _, err := filedigest.Of(l.signed)
		if err != nil {
			return nil, err
		}
		sb.record.Loaders = append(sb.record.Loaders, contract.BootFile{Path: l.path, Digest: dg})
	}
	return sb, nil
}

// Record is what kiln.json records of the signed boot files Write writes.
func (sb *SecureBootESP) Record() *contract.SecureBoot { return sb.record }

// Remove removes the temporary files.
func (sb *SecureBootESP) Remove() {
	if sb != nil {
		os.RemoveAll(sb.dir)
	}
}

// ErrNoSecureBootKey: a recipe with secureBoot and no --secure-boot-key.
var ErrNoSecureBootKey = errors.New("no --secure-boot-key")

type noKeyError struct{ error }

func (e noKeyError) Unwrap() []error { return []error{e.error, ErrNoSecureBootKey} }

// CheckSecureBootKey checks what signing for recipe r's secureBoot needs
// before any long work: the host tools, systemd-stub, and key (the
// --secure-boot-key given; "" wraps ErrNoSecureBootKey) against the
// recipe's db certificate, which it returns. what names the output
// ("disk", "bundle").
func CheckSecureBootKey(r *recipes.Recipe, key, what string) (cert string, err error) {
	keys := r.Resolve(r.SecureBoot.Keys)
	if key == "" {
		return "", noKeyError{r.Errorf("secureBoot.keys", "the recipe makes a Secure Boot %s: give the db private key with --secure-boot-key %s (the recipe names only the public files)", what, secureboot.Key(keys, secureboot.DB))}
	}
	if err := hosttools.Check(SecureBootTools...); err != nil {
		return "", err
	}
	// systemd-stub is a file, not a program: checked now too, not once
	// the images are fetched.
	if info, err := uki.LoaderInfo(uki.Stub); err != nil || !strings.HasPrefix(info, "systemd-stub ") {
		return "", fmt.Errorf("systemd-stub %s, which every unified kernel image starts with, is missing or not systemd-stub: install it as root with: apt-get install systemd-boot-efi", uki.Stub)
	}
	cert = secureboot.Cert(keys, secureboot.DB)
	if err := checkDBKey(cert, key, time.Now()); err != nil {
		return "", r.Errorf("secureBoot.keys", "%v", err)
	}
	return cert, nil
}

// SignedUKI writes out, the db-signed unified kernel image of entry e
// (its kernel and initramfs images local copies): its command line is the
// entry's options and the image partition's root hash, its os-release
// from the entry. The factory build and kiln bundle both make them so. An
// empty imagesRootHash leaves it out: a reflash stick's image partition
// has none (SecureBootESPOptions.NoImageVerity); callers signing a disk's
// or a bundle's UKIs check theirs is there.
func SignedUKI(ctx context.Context, out string, e *bootentry.Entry, kernel string, initrds []string, imagesRootHash, key, cert string) error {
	cmdline := slices.Clone(e.Options)
	if imagesRootHash != "" {
		cmdline = append(cmdline, contract.ImagesRootHashParam+"="+imagesRootHash)
	}
	err := uki.Build(ctx, out, uki.Inputs{
		Kernel:    kernel,
		Initrds:   initrds,
		Cmdline:   strings.Join(cmdline, " "),
		OSRelease: osRelease(e),
	})
	if err != nil {
		return fmt.Errorf("unified kernel image for entry %s: %w", e.ID, err)
	}
	return uki.Sign(ctx, out, out, key, cert)
}

// espOf is the base's EFI system partition, read in place or from its copy.
func espOf(d *base.Disk) (esp.FS, error) {
	p, err := osslots.FindESP(d.Layout)
	if err != nil {
		return esp.FS{}, err
	}
	file, off, err := d.PartitionFile(p)
	if err != nil {
		return esp.FS{}, fmt.Errorf("read its ESP: %w", err)
	}
	return esp.FS{Disk: file, Offset: off}, nil
}

// readEntries reads the base's boot loader entries: each one mounts the
// release's slot (osslots read them so) and becomes a UKI; its kernel and
// initramfs images are copied out.
func (sb *SecureBootESP) readEntries(fs esp.FS) error {
	names, err := fs.List(bootentry.Dir)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		data, err := fs.Read(path.Join(bootentry.Dir, name), sb.dir)
		if err != nil {
			return err
		}
		e, err := bootentry.Decode(name, bytes.NewReader(data))
		if errors.Is(err, bootentry.ErrNotEntry) {
			continue
		}
		if err != nil {
			return err
		}
		if _, ok, err := bootentry.ParseUsrVerity(e.Options); err != nil || !ok {
			return fmt.Errorf("boot loader entry %s mounts no OS slot: under Secure Boot every entry becomes a signed unified kernel image of the release, and an unsigned one would stay; remove it from the base", name)
		}
		if e.Linux == "" {
			return fmt.Errorf("boot loader entry %s has no linux line: a unified kernel image needs its kernel", name)
		}
		local := filepath.Join(sb.dir, "entry-"+e.ID)
		if err := os.Mkdir(local, 0o755); err != nil {
			return err
		}
		ue := ukiEntry{entry: e, uki: contract.UKI{Path: path.Join(ukiDir, e.ID+".efi"), Entry: e.ID, FirstBoot: slices.Contains(e.Options, firstBootParam)}}
		for i, p := range append([]string{e.Linux}, e.Initrd...) {
			dst := filepath.Join(local, strconv.Itoa(i))
			if err := fs.CopyOut(strings.TrimPrefix(p, "/"), dst); err != nil {
				return fmt.Errorf("boot loader entry %s names %s: %w", name, p, err)
			}
			if i == 0 {
				ue.kernel = dst
			} else {
				ue.initrds = append(ue.initrds, dst)
			}
			if rel := strings.TrimPrefix(p, "/"); !slices.Contains(sb.remove, rel) {
				sb.remove = append(sb.remove, rel)
			}
		}
		sb.remove = append(sb.remove, path.Join(bootentry.Dir, name))
		sb.entries = append(sb.entries, ue)
	}
	if len(sb.entries) == 0 {
		return fmt.Errorf("no boot loader entry in %s on its ESP boots the release", bootentry.Dir)
	}
	return nil
}

// signLoaders signs systemd-boot where the base has it. A fallback loader
// that is not systemd-boot (shim, GRUB) is refused: it would stay unsigned.
func (sb *SecureBootESP) signLoaders(ctx context.Context, fs esp.FS) error {
	for i, p := range systemdBootPaths {
		ok, err := fs.Exists(p)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		local := filepath.Join(sb.dir, "loader-"+strconv.Itoa(i)+".efi")
		if err := fs.CopyOut(p, local); err != nil {
			return err
		}
		info, err := uki.LoaderInfo(local)
		if err != nil {
			return fmt.Errorf("%s on its ESP: %w", p, err)
		}
		v, isBoot := strings.CutPrefix(info, "systemd-boot ")
		if !isBoot {
			return fmt.Errorf("%s on its ESP is not systemd-boot (it says %q): a Secure Boot disk boots systemd-boot signed with db", p, info)
		}
		if major, _, _ := strings.Cut(v, "."); atoiOr0(major) < enrollSince {
			return fmt.Errorf("%s on its ESP is systemd-boot %s, older than %d, the first that enrols Secure Boot keys (secure-boot-enroll)", p, v, enrollSince)
		}
		if err := uki.Sign(ctx, local, local, sb.o.Key, sb.cert); err != nil {
			return err
		}
		sb.loaders = append(sb.loaders, signedLoader{path: p, signed: local})
	}
	if len(sb.loaders) == 0 {
		return fmt.Errorf("no systemd-boot on its ESP (%s): a Secure Boot disk boots signed unified kernel images from systemd-boot", strings.Join(systemdBootPaths, ", "))
	}
	return nil
}

func atoiOr0(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// Write writes the signed boot files on the new disk's ESP, once the
// image partition's identity is known (partitions.WithESP): a signed UKI
// for each entry it replaces (removed, with its kernel and initramfs, so
// no unsigned path stays), systemd-boot signed, the keys to enrol and
// loader.conf.
func (sb *SecureBootESP) Write(ctx context.Context, disk string, l *gpt.Layout, id partitions.ImageIdentity) error {
	var imagesRootHash string
	if !sb.o.NoImageVerity {
		if id.Verity == nil || id.Verity.RootHash == "" {
			return errors.New("secure boot: the image partition has no dm-verity root hash to sign")
		}
		imagesRootHash = id.Verity.RootHash
	}
	p, err := osslots.FindESP(l)
	if err != nil {
		return err
	}
	fs := esp.FS{Disk: disk, Offset: p.Offset, Epoch: sb.o.Epoch}
	for _, f := range sb.remove {
		if err := fs.Remove(f); err != nil {
			return err
		}
	}
	for _, e := range sb.entries {
		local := filepath.Join(sb.dir, e.entry.ID+".efi")
		if err := SignedUKI(ctx, local, e.entry, e.kernel, e.initrds, imagesRootHash, sb.o.Key, sb.cert); err != nil {
			return err
		}
		if err := fs.CopyIn(local, e.uki.Path); err != nil {
			return err
		}
	}
	for _, ld := range sb.loaders {
		if err := fs.CopyIn(ld.signed, ld.path); err != nil {
			return err
		}
	}
	for _, name := range secureboot.Names {
		if err := fs.CopyIn(sb.auths[name], path.Join(sb.record.Keys, name+".auth")); err != nil {
			return err
		}
	}
	return fs.Write(loaderConf, sb.loaderConf, sb.dir)
}

// osRelease is the os-release a UKI carries, from its entry: systemd-boot
// lists the UKI by its PRETTY_NAME and orders by VERSION_ID.
func osRelease(e *bootentry.Entry) []byte {
	title := e.Title
	if title == "" {
		title = e.ID
	}
	var w bytes.Buffer
	fmt.Fprintf(&w, "NAME=%s\nPRETTY_NAME=%s\nID=kiln\n", osReleaseQuote(title), osReleaseQuote(title))
	if e.Version != "" {
		fmt.Fprintf(&w, "VERSION_ID=%s\n", osReleaseQuote(e.Version))
	}
	return w.Bytes()
}

// osReleaseQuote quotes a value as os-release(5) reads it: shell-like
// double quotes, with ", \, $ and ` escaped.
func osReleaseQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`")
	return `"` + r.Replace(s) + `"`
}

// secureBootLoaderConf is loader.conf with enrolment on and a default that
// named a replaced entry (ID.conf) naming its UKI (ID.efi).
func secureBootLoaderConf(conf []byte, ids []string) []byte {
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(conf), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "secure-boot-enroll" {
			continue
		}
		if len(f) == 2 && f[0] == "default" {
			if id, ok := strings.CutSuffix(f[1], bootentry.Suffix); ok && slices.Contains(ids, id) {
				line = "default " + id + ".efi\n"
			}
		}
		out.WriteString(line)
	}
	if out.Len() > 0 && !bytes.HasSuffix(out.Bytes(), []byte("\n")) {
		out.WriteByte('\n')
	}
	out.WriteString(enrollSetting + "\n")
	return out.Bytes()
}

// checkDBKey checks that key is the private key of the db certificate
// cert, and that cert is valid at now.
func checkDBKey(cert, key string, now time.Time) error {
	c, err := readCert(cert)
	if err != nil {
		return err
	}
	if now.After(c.NotAfter) {
		return fmt.Errorf("db certificate %s expired on %s: make new keys (kiln key secureboot) and enrol them", cert, c.NotAfter.Format(time.DateOnly))
	}
	data, err := os.ReadFile(key)
	if err != nil {
		return fmt.Errorf("--secure-boot-key: %w", err)
	}
	blk, _ := pem.Decode(data)
	if blk == nil {
		return fmt.Errorf("--secure-boot-key %s is not a PEM private key: give the db.key kiln key secureboot wrote", key)
	}
	var priv any
	if priv, err = x509.ParsePKCS8PrivateKey(blk.Bytes); err != nil {
		if priv, err = x509.ParsePKCS1PrivateKey(blk.Bytes); err != nil {
			return fmt.Errorf("--secure-boot-key %s is not a private key (%s block): give the db.key kiln key secureboot wrote", key, blk.Type)
		}
	}
	var pub interface{ Equal(crypto.PublicKey) bool }
	if signer, ok := priv.(crypto.Signer); ok {
		pub, _ = signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	}
	if pub == nil || !pub.Equal(c.PublicKey) {
		return fmt.Errorf("--secure-boot-key %s does not match the recipe's db certificate %s (%s): give the db.key kiln key secureboot wrote beside it", key, cert, c.Subject.CommonName)
	}
	return nil
}

// readCert reads a PEM certificate.
func readCert(file string) (*x509.Certificate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("db certificate: %w", err)
	}
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("db certificate %s is not a PEM certificate: give the db.crt kiln key secureboot wrote", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("db certificate %s: %w", file, err)
	}
	return c, nil
}

// copyFile copies src to dst (a new file).
func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}
