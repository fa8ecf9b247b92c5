package builder

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/partitions/esp"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// SecureBootError names the file on the ESP that failed CheckSecureBoot.
type SecureBootError struct {
	File string // on the ESP, e.g. EFI/Linux/kiln-1.0.efi
	Err  error
}

func (e *SecureBootError) Error() string { return "ESP file " + e.File + ": " + e.Err.Error() }
func (e *SecureBootError) Unwrap() error { return e.Err }

// DBName is the common name of a Secure Boot record's db certificate.
func DBName(sb *contract.SecureBoot) (string, error) {
	c, err := parseCert([]byte(sb.DB))
	if err != nil {
		return "", err
	}
	return c.Subject.CommonName, nil
}

func parseCert(data []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("kiln.json's secureBoot.db is not a PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// CheckSecureBoot checks the signed boot files kiln.json (c) records on the
// disk's ESP, as the firmware and systemd-stub read them: every unified
// kernel image and systemd-boot binary's signature against the recorded db
// certificate (and each systemd-boot's bytes against its digest), and each
// UKI's signed command line: usrhash= must be the root hash of the slot it
// mounts, proved by dm-verity over every block of the slot, and
// kiln.images.roothash= the image partition's, imageRootHash ("": not
// proved, compared with the image partition's GUID, derived from it). On a booted disk (booted), a first-boot UKI the
// node removed is reported as not checked, and systemd-boot is checked by
// its signature only (bootctl update may replace it).
func CheckSecureBoot(ctx context.Context, disk string, l *gpt.Layout, c *contract.Contents, imageRootHash string, booted bool) (checked, unchecked []string, err error) {
	sb := c.SecureBoot
	dbCert, err := parseCert([]byte(sb.DB))
	if err != nil {
		return nil, nil, err
	}
	espPart, err := osslots.FindESP(l)
	if err != nil {
		return nil, nil, err
	}
	fs := esp.FS{Disk: disk, Offset: espPart.Offset}
	dir, err := os.MkdirTemp("", "kiln-verify-secureboot-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	cert := filepath.Join(dir, "db.crt")
	if err := os.WriteFile(cert, []byte(sb.DB), 0o644); err != nil {
		return nil, nil, err
	}
	part := fmt.Sprintf("partition %d (%s)", espPart.Number, espPart.Name)
	copyOut := func(p string, i int) (string, error) {
		local := filepath.Join(dir, strconv.Itoa(i)+".efi")
		if err := fs.CopyOut(p, local); err != nil {
			if errors.Is(err, esp.ErrNotExist) {
				return "", &SecureBootError{p, errors.New("missing: the build wrote it, and the boot loader needs it")}
			}
			return "", err
		}
		return local, nil
	}
	verify := func(p, local string) error {
		if err := uki.Verify(ctx, local, cert); err != nil {
			// uki.Verify names the copies: say what they stand for.
			msg := strings.TrimPrefix(err.Error(), local+": ")
			msg = strings.ReplaceAll(strings.ReplaceAll(msg, cert, "kiln.json's db certificate"), local, p)
			return &SecureBootError{p, errors.New(msg)}
		}
		return nil
	}
	for i, ld := range sb.Loaders {
		local, err := copyOut(ld.Path, i)
		if err != nil {
			return nil, nil, err
		}
		if err := verify(ld.Path, local); err != nil {
			return nil, nil, err
		}
		if !booted {
			if dg, _, err := filedigest.Of(local); err != nil {
				return nil, nil, err
			} else if dg != ld.Digest {
				return nil, nil, &SecureBootError{ld.Path, fmt.Errorf("signed for db but not the systemd-boot the build signed (sha256 %s, kiln.json records %s)", dg, ld.Digest)}
			}
		}
	}
	slotsChecked := map[string]bool{} // usr PARTUUID + root hash proved by dm-verity
	n := 0
	for i, u := range sb.UKIs {
		local, err := copyOut(u.Path, len(sb.Loaders)+i)
		var sbe *SecureBootError
		if booted && u.FirstBoot && errors.As(err, &sbe) {
			unchecked = append(unchecked, part+": "+u.Path+": the first-boot image, removed by the node once Ignition ran")
			continue
		}
		if booted && errors.As(err, &sbe) {
			unchecked = append(unchecked, part+": "+u.Path+": the factory's image, removed by the node when an upgrade wrote the slot it booted")
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if err := verify(u.Path, local); err != nil {
			return nil, nil, err
		}
		secs, err := uki.Read(local)
		if err != nil {
			return nil, nil, &SecureBootError{u.Path, errors.New(strings.ReplaceAll(err.Error(), local, u.Path))}
		}
		if err := checkUKIRootHashes(ctx, disk, l, secs, imageRootHash, slotsChecked); err != nil {
			return nil, nil, &SecureBootError{u.Path, err}
		}
		n++
	}
	if booted {
		// The images the node wrote (a field upgrade's, bootentry's type
		// #2 names): held to the same signature and root hashes.
		names, err := fs.List(bootentry.UKIDir)
		if err != nil && !errors.Is(err, esp.ErrNotExist) {
			return nil, nil, err
		}
		for i, name := range names {
			p := path.Join(bootentry.UKIDir, name)
			if slices.ContainsFunc(sb.UKIs, func(u contract.UKI) bool { return u.Path == p }) {
				continue
			}
			if en, err := bootentry.ParseFileName(name); err != nil || !en.UKI {
				unchecked = append(unchecked, part+": "+human.Quote(p)+": not a unified kernel image's name (no "+bootentry.UKISuffix+"): the boot loader skips it")
				continue
			}
			local, err := copyOut(p, len(sb.Loaders)+len(sb.UKIs)+i)
			if err != nil {
				return nil, nil, err
			}
			if err := verify(p, local); err != nil {
				return nil, nil, err
			}
			secs, err := uki.Read(local)
			if err != nil {
				return nil, nil, &SecureBootError{p, errors.New(strings.ReplaceAll(err.Error(), local, p))}
			}
			if err := checkUKIRootHashes(ctx, disk, l, secs, imageRootHash, slotsChecked); err != nil {
				return nil, nil, &SecureBootError{p, err}
			}
			n++
		}
	}
	what := fmt.Sprintf("%s: %d unified kernel images and %d systemd-boot binaries signed for db %q", part, n, len(sb.Loaders), dbCert.Subject.CommonName)
	if n > 0 {
		what += "; the images' signed command lines name the root hashes of /usr (proved by dm-verity, every block)"
		if imageRootHash != "" {
			what += " and of the image partition"
		}
	}
	return append(checked, what), unchecked, nil
}

// ukiEntries reads the unified kernel images in the ESP's EFI/Linux as the
// entries their signed command lines make (ID without the boot counter,
// VERSION_ID of their os-release), for osslots.CheckBooted to check the
// slots they boot; CheckSecureBoot holds them to their signatures.
func ukiEntries(disk string, l *gpt.Layout) ([]*bootentry.Entry, error) {
	espPart, err := osslots.FindESP(l)
	if err != nil {
		return nil, err
	}
	fs := esp.FS{Disk: disk, Offset: espPart.Offset}
	names, err := fs.List(bootentry.UKIDir)
	if errors.Is(err, esp.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kiln-verify-ukis-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var entries []*bootentry.Entry
	for i, name := range names {
		n, err := bootentry.ParseFileName(name)
		if err != nil || !n.UKI {
			continue // CheckSecureBoot reports it
		}
		local := filepath.Join(dir, strconv.Itoa(i)+".efi")
		if err := fs.CopyOut(path.Join(bootentry.UKIDir, name), local); err != nil {
			return nil, err
		}
		secs, err := uki.Read(local)
		if err != nil {
			return nil, &SecureBootError{path.Join(bootentry.UKIDir, name), errors.New(strings.ReplaceAll(err.Error(), local, name))}
		}
		entries = append(entries, &bootentry.Entry{ID: n.ID, Version: osReleaseValue(secs.OSRelease, "VERSION_ID"), Options: strings.Fields(secs.Cmdline)})
	}
	return entries, nil
}

// osReleaseValue is key's value in os-release text, unquoted; "" if none.
func osReleaseValue(osrel []byte, key string) string {
	for _, l := range strings.Split(string(osrel), "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return strings.Trim(v, `"'`)
		}
	}
	return ""
}

// checkUKIRootHashes checks a UKI's signed command line against the disk:
// the slot its usrhash= mounts through dm-verity (each slot and hash once,
// in done), and kiln.images.roothash= against imageRootHash.
func checkUKIRootHashes(ctx context.Context, disk string, l *gpt.Layout, secs uki.Sections, imageRootHash string, done map[string]bool) error {
	img, ok := secs.Param(contract.ImagesRootHashParam)
	switch {
	case !ok:
		return fmt.Errorf("its signed command line has no %s=: the image partition's root hash is not signed", contract.ImagesRootHashParam)
	case imageRootHash != "" && img != imageRootHash:
		return fmt.Errorf("its signed command line names image partition root hash %s, the disk's image partition has %s", img, imageRootHash)
	case imageRootHash == "":
		// Not proved here (the seal failed): the image partition's GUID
		// is its root hash's first 128 bits, enough to name a UKI that
		// boots another image partition.
		if p, found := l.Find(contract.PartitionName); found {
			if guid, err := (&verity.Verity{RootHash: img}).PartitionGUID(); err != nil || !strings.EqualFold(guid, p.GUID) {
				return fmt.Errorf("its signed command line names image partition root hash %s, not that of the disk's image partition (GUID %s)", img, p.GUID)
			}
		}
	}
	usr, ok, err := bootentry.ParseUsrVerity(strings.Fields(secs.Cmdline))
	if err != nil {
		return fmt.Errorf("its signed command line: %w", err)
	}
	if !ok {
		return errors.New("its signed command line mounts no /usr slot (usrhash=, systemd.verity_usr_data=, systemd.verity_usr_hash=)")
	}
	key := usr.DataPartUUID + " " + usr.HashPartUUID + " " + usr.RootHash
	if done[key] {
		return nil
	}
	var data, hash *gpt.Partition
	for i, p := range l.Partitions {
		switch strings.ToLower(p.GUID) {
		case usr.DataPartUUID:
			data = &l.Partitions[i]
		case usr.HashPartUUID:
			hash = &l.Partitions[i]
		}
	}
	if data == nil || hash == nil {
		return fmt.Errorf("its signed command line mounts /usr from PARTUUID %s with the hash tree of PARTUUID %s, not both on this disk", usr.DataPartUUID, usr.HashPartUUID)
	}
	f, err := os.Open(disk)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := verity.ReadSlot(ctx, io.NewSectionReader(f, data.Offset, data.Size), io.NewSectionReader(f, hash.Offset, hash.Size), usr.RootHash); err != nil {
		return fmt.Errorf("its signed usrhash=%s is not the root hash of partition %d (%s): %w", usr.RootHash, data.Number, data.Name, err)
	}
	done[key] = true
	return nil
}

// SecureBootLine says in one line whether a disk is Secure Boot-ready.
func SecureBootLine(rep *Report) string {
	c := rep.Contents
	switch {
	case c == nil:
		return "Secure Boot: not ready (a base image: kiln build with a recipe's secureBoot makes a ready disk)"
	case c.SecureBoot == nil && c.OSSlots == nil:
		return "Secure Boot: not ready (built without secureBoot, from a base without A/B OS slots)"
	case c.SecureBoot == nil:
		return "Secure Boot: not ready (built without secureBoot in its recipe: boot loader entries, unsigned)"
	}
	return SecureBootReadyLine(c.SecureBoot)
}

// SecureBootReadyLine is SecureBootLine of a disk, or a reflash stick,
// whose record (sb) says its boot files are signed.
func SecureBootReadyLine(sb *contract.SecureBoot) string {
	cn, err := DBName(sb)
	if err != nil {
		return "Secure Boot: not ready (" + err.Error() + ")"
	}
	return fmt.Sprintf("Secure Boot: ready (db %q, %d unified kernel images, keys to enrol in %s)", cn, len(sb.UKIs), path.Clean(sb.Keys))
}

// nameSecureBootFile is sealErr, the seal's verdict on a damaged disk,
// with the file on the ESP that fails its signature or command line first
// when the disk is Secure Boot-ready: the seal names only the partition.
// Whatever cannot be read here leaves sealErr as it is.
func nameSecureBootFile(ctx context.Context, disk string, booted bool, sealErr error) error {
	rep, err := Inspect(disk)
	if err != nil || rep.Contents == nil || rep.Contents.SecureBoot == nil {
		return sealErr
	}
	var sbe *SecureBootError
	if _, _, err := CheckSecureBoot(ctx, disk, rep.Layout, rep.Contents, "", booted); errors.As(err, &sbe) {
		return fmt.Errorf("%w (%v)", sbe, sealErr)
	}
	return sealErr
}
