package bundle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/esp"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// A bundle of a recipe with secureBoot carries the release's entry as
// db-signed unified kernel images, made as the factory build makes them
// (builder.SignedUKI): a Secure Boot node boots nothing else. Their signed
// command line names the slot's partitions and the image partition's root
// hash, so there is one for each slot of each image partition the bundle
// applies to: those of the Secure Boot disks given with --from.

// checkSecureBoot checks the db key before any long work, for a recipe
// with secureBoot.
func (b *bundler) checkSecureBoot(context.Context) error {
	r := b.Recipe
	if r.SecureBoot == nil {
		if b.o.SecureBootKey != "" {
			return fmt.Errorf("--secure-boot-key %s: recipe %s has no secureBoot section, so nothing is signed: drop --secure-boot-key", b.o.SecureBootKey, r.Path)
		}
		return nil
	}
	cert, err := builder.CheckSecureBootKey(r, b.o.SecureBootKey, "bundle")
	if err != nil {
		return err
	}
	b.dbCert = cert
	return nil
}

// secureBootDisk reads, of a Secure Boot disk given with --from, the image
// partition's root hash its factory UKIs carry (signed; the disk is the
// factory's own output, as every --from is).
func secureBootDisk(disk string, l *gpt.Layout, c *contract.Contents) (string, error) {
	d, err := base.OpenDisk(disk, "")
	if err != nil {
		return "", err
	}
	defer d.Close()
	var part *gpt.Partition
	for i, p := range l.Partitions {
		if p.Name == "EFI-SYSTEM" || p.Type == osslots.ESPType {
			part = &l.Partitions[i]
		}
	}
	if part == nil || len(c.SecureBoot.UKIs) == 0 {
		return "", fmt.Errorf("a Secure Boot disk (kiln.json) without an ESP or unified kernel images")
	}
	file, off, err := d.PartitionFile(*part)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "kiln-from-uki-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	local := filepath.Join(dir, "uki.efi")
	if err := (esp.FS{Disk: file, Offset: off}).CopyOut(c.SecureBoot.UKIs[0].Path, local); err != nil {
		return "", fmt.Errorf("its unified kernel image %s: %w", c.SecureBoot.UKIs[0].Path, err)
	}
	s, err := uki.Read(local)
	if err != nil {
		return "", err
	}
	h, ok := s.Param(contract.ImagesRootHashParam)
	if !ok {
		return "", fmt.Errorf("its unified kernel image %s has no %s= on its command line", c.SecureBoot.UKIs[0].Path, contract.ImagesRootHashParam)
	}
	return h, nil
}

// signUKIs writes the release's signed images into the bundle's OS
// section: for each image partition of the --from Secure Boot disks, one
// for each slot, with the command line the node writes for that slot.
func (b *bundler) signUKIs(ctx context.Context) error {
	if b.dbCert == "" || b.m.OS == nil {
		return nil
	}
	type target struct{ images, agent string }
	var targets []target
	for _, p := range b.priors {
		if p.imagesRootHash != "" && !slices.Contains(targets, target{p.imagesRootHash, p.agent}) {
			targets = append(targets, target{p.imagesRootHash, p.agent})
		}
	}
	if len(targets) == 0 {
		return fmt.Errorf("recipe %s has secureBoot: each signed unified kernel image names the image partition of the nodes it boots, so give --from each Secure Boot disk the appliances were built as (kiln bundle --from disk-1.0.raw)", b.Recipe.Path)
	}
	o := b.m.OS
	rel := b.os
	var initrds []string
	for _, f := range rel.boot[1:] {
		initrds = append(initrds, f.local)
	}
	dir := filepath.Join(b.tree, filepath.FromSlash(bundlefmt.OSBlobDir))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	task := b.o.Progress.Task(fmt.Sprintf("sign %d unified kernel image(s)", 2*len(targets)), 0)
	var err error
	defer func() { task.Done(err) }()
	for _, t := range targets {
		for _, sl := range rel.slots.Slots {
			usr, err := bootentry.UsrVerity{RootHash: o.Usr.Verity.RootHash, DataPartUUID: sl.Usr.PartUUID, HashPartUUID: sl.UsrVerity.PartUUID, FSType: o.Entry.UsrFSType}.Options()
			if err != nil {
				return err
			}
			// The entry the node writes for the slot (osinstall): the
			// bundle's options, the slot's, and the hand-off to the
			// release's agent when it is not the image partition's.
			e := &bootentry.Entry{ID: contract.EntryID(b.m.Version), Title: o.Entry.Title, Version: o.Entry.Version,
				Options: append(slices.Clone(o.Entry.Options), usr...)}
			if b.m.Agent.Digest != t.agent {
				e.Options = append(e.Options, contract.AgentOption(b.m.Agent.Digest))
			}
			tmp := filepath.Join(dir, ".uki-"+sl.Name+".efi")
			if err = builder.SignedUKI(ctx, tmp, e, rel.boot[0].local, initrds, t.images, b.o.SecureBootKey, b.dbCert); err != nil {
				return err
			}
			d, n, err := filedigest.Of(tmp)
			if err != nil {
				return err
			}
			if err := os.Rename(tmp, filepath.Join(b.tree, filepath.FromSlash(bundlefmt.OSFile(d)))); err != nil {
				return err
			}
			o.UKIs = append(o.UKIs, bundlefmt.UKIFile{Slot: sl.Name, ImagesRootHash: t.images, Digest: d, Size: n})
		}
	}
	return nil
}
