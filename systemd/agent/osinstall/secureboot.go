package osinstall

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/partitions/uki"
	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/opencontainers/go-digest"
)

// On a Secure Boot node (kiln.json's secureBoot) a release's entry is the
// bundle's signed unified kernel image for the slot written, whose command
// line the firmware's signature check covers: the node takes it only when
// it is the signed manifest's file, carries a signature the node's db
// certificate verifies, and its command line is exactly what the node
// would write itself for that slot (usrhash= the manifest's root hash) and
// names this node's image partition (kiln.images.roothash=). All of it is
// checked on a copy in memory-backed temporary space before anything is
// written; the copy, not the stick, is what goes onto the ESP.

// ukiPlan is the checked image: its temporary copy and what it is.
type ukiPlan struct {
	bundlefmt.UKIFile
	dir, file string // the temporary copy
}

// imagesRootHash is the image partition's root hash the running kernel was
// given in its signed command line.
func (n Node) imagesRootHash() (string, error) {
	b, err := os.ReadFile(n.path(Cmdline))
	if err != nil {
		return "", fmt.Errorf("the image partition's root hash: %w", err)
	}
	v := ""
	for _, f := range strings.Fields(string(b)) {
		if k, val, _ := strings.Cut(f, "="); k == contract.ImagesRootHashParam {
			v = val
		}
	}
	if v == "" {
		return "", fmt.Errorf("this node is Secure Boot-ready (kiln.json) but its kernel command line has no %s=: it did not boot a signed unified kernel image of its factory, so it cannot tell which image partition a new one must name", contract.ImagesRootHashParam)
	}
	return v, nil
}

// dbCert is the node's db certificate, as kiln.json records it.
func (n Node) dbCert() (*x509.Certificate, error) {
	blk, _ := pem.Decode([]byte(n.SecureBoot.DB))
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("kiln.json's secureBoot.db is not a PEM certificate: the image partition is damaged; reflash the node")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("kiln.json's secureBoot.db: %w", err)
	}
	return c, nil
}

// checkUKI picks the bundle's image for the target slot and this node's
// image partition, copies it out and checks it; want is the entry the node
// would write for the slot (its options, without the image partition's
// root hash).
func (p *Plan) checkUKI(want bootentry.Entry) (err error) {
	n := p.node
	o := p.m.OS
	if len(o.UKIs) == 0 {
		return fmt.Errorf("this node boots only unified kernel images signed for its Secure Boot db, and bundle %s brings none for its release: make the bundle with kiln bundle --secure-boot-key DIR/db.key", p.m.Version)
	}
	db, err := n.dbCert()
	if err != nil {
		return err
	}
	images, err := n.imagesRootHash()
	if err != nil {
		return err
	}
	u, ok := o.UKI(p.target.Name, images)
	if !ok {
		return fmt.Errorf("bundle %s brings no signed unified kernel image for slot %s of a node whose image partition has root hash %s: make the bundle --from this node's factory disk", p.m.Version, p.target.Name, images)
	}
	off, size, err := p.file(u.Digest)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kiln-uki-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	file := filepath.Join(dir, "uki.efi")
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	got, err := io.Copy(io.MultiWriter(f, h), io.NewSectionReader(p.r, off, size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("read the unified kernel image %s: %w", u.Digest, err)
	}
	if d := digest.NewDigest(digest.SHA256, h).String(); d != u.Digest || got != u.Size {
		return fmt.Errorf("%w: the unified kernel image for slot %s (%s) reads as %s, %d bytes: it is not the signed manifest's %s", bundlefmt.ErrDamaged, p.target.Name, bundlefmt.OSFile(u.Digest), d, got, u.Digest)
	}
	if err := uki.CheckSignature(file, db); err != nil {
		return fmt.Errorf("the unified kernel image for slot %s is not signed for this node's Secure Boot db (%s): %w; the firmware would refuse to boot it: make the bundle with the db key of this node's recipe", p.target.Name, human.Quote(db.Subject.CommonName), err)
	}
	s, err := uki.Read(file)
	if err != nil {
		return fmt.Errorf("the unified kernel image for slot %s: %w", p.target.Name, err)
	}
	if h, _ := s.Param("usrhash"); h != o.Usr.Verity.RootHash {
		return fmt.Errorf("the unified kernel image for slot %s is signed with usrhash=%s, but the signed manifest's /usr root hash is %s: it would not boot the slot written", p.target.Name, human.Quote(h), o.Usr.Verity.RootHash)
	}
	if h, _ := s.Param(contract.ImagesRootHashParam); h != images {
		return fmt.Errorf("the unified kernel image for slot %s is signed with %s=%s, but this node's image partition has root hash %s: make the bundle --from this node's factory disk", p.target.Name, contract.ImagesRootHashParam, human.Quote(h), images)
	}
	wantOpts := append(slices.Clone(want.Options), contract.ImagesRootHashParam+"="+images)
	if got := strings.Fields(s.Cmdline); !slices.Equal(got, wantOpts) {
		return fmt.Errorf("the unified kernel image for slot %s is signed with the command line %s, not %s, which this node writes for the slot", p.target.Name, human.Quote(s.Cmdline), human.Quote(strings.Join(wantOpts, " ")))
	}
	p.uki = &ukiPlan{UKIFile: u, dir: dir, file: file}
	p.OS = contract.ReleaseOS{Slot: p.target.Name, RootHash: o.Usr.Verity.RootHash, Entry: want.ID,
		Title: want.Title, Version: want.Version, Options: wantOpts, UKI: u.Digest}
	return nil
}

// sameUKIAsRunning says whether the running release's entry is this very
// signed image.
func (p *Plan) sameUKIAsRunning() (bool, error) {
	esp := p.node.esp()
	n, ok, err := bootloader.Find(esp, p.node.Entry)
	if err != nil || !ok || p.node.Entry == "" || !n.UKI {
		return false, err
	}
	d, err := bootloader.Digest(esp, n.Path())
	if err != nil {
		return false, nil //nolint:nilerr // an entry that does not read is not the same OS
	}
	return d == p.uki.Digest, nil
}

// ukiFits refuses an image the ESP has no room for.
func (p *Plan) ukiFits() error {
	if ok, err := bootloader.HasBootFile(p.node.esp(), p.uki.Digest); err != nil || ok {
		return err
	}
	free, err := freeOnESP(p)
	if err != nil {
		return err
	}
	if need := p.uki.Size; need > free {
		return fmt.Errorf("the release's signed unified kernel image needs %s on the ESP (%s), which has %s free: it must have %d bytes more free", human.Bytes(need), p.node.ESP, human.Bytes(free), need-free)
	}
	return nil
}

// writeUKI puts the checked copy on the ESP by digest; the state machine
// renames it into EFI/Linux once the release is staged.
func (p *Plan) writeUKI(o options) error {
	o.step("copy unified kernel image")
	f, err := os.Open(p.uki.file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := bootloader.WriteBootFile(p.node.esp(), p.uki.Digest, p.uki.Size, f); err != nil {
		return fmt.Errorf("os: unified kernel image: %w", err)
	}
	fmt.Fprintf(o.log, "os: signed unified kernel image for slot %s (%s) copied onto the ESP\n", p.target.Name, human.Bytes(p.uki.Size))
	return nil
}

// Close removes what Prepare kept in temporary space.
func (p *Plan) Close() error {
	if p == nil || p.uki == nil {
		return nil
	}
	return os.RemoveAll(p.uki.dir)
}
