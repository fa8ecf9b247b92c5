package builder

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
	"github.com/opencontainers/go-digest"
)

// Report is what `kiln inspect` shows of a disk image.
type Report struct {
	Disk     string             `json:"disk"`
	Layout   *gpt.Layout        `json:"layout"`
	Contents *contract.Contents `json:"contents,omitempty"`
	// OSSlots is the OS's A/B slots (kiln.json's on a built disk, read
	// from the partition table and the ESP on a base); null when there are
	// none: a release changes images and files only.
	OSSlots *contract.OSSlots `json:"osSlots"`
	// OSSlotsError says why a base's slots cannot be used (a build from
	// it is refused with it).
	OSSlotsError string `json:"osSlotsError,omitempty"`
	// Sizes of the image partition's parts (oci, storage, bin), bytes,
	// hard-linked files counted once per path as kiln.json lists them.
	Sizes map[string]int64 `json:"sizes,omitempty"`
	// Trust is the keys a built disk's nodes accept upgrade bundles from,
	// ReleaseFiles its release's files, both from its Ignition config.
	Trust        []contract.TrustKey    `json:"trust,omitempty"`
	ReleaseFiles []contract.ReleaseFile `json:"releaseFiles,omitempty"`
	// Verified is what Verify checked against the build's seal, and what
	// it could not check.
	Verified *seal.Report `json:"verified,omitempty"`
}

// recoverAs turns a panic of a disk reader into an error naming the part.
func recoverAs(err *error, part string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%s is unreadable (the reader failed: %v): the disk is damaged or not built by kiln; rebuild or reflash it", part, r)
	}
}

// Inspect reads a disk image's partition table and its image partition's
// kiln.json, without mounting anything. A damaged disk is an error naming
// the part, never a panic: go-diskfs's squashfs reader panics on some bit
// flips, so its use is fenced here.
func Inspect(disk string) (rep *Report, err error) {
	defer recoverAs(&err, disk+": image partition")
	layout, err := gpt.Inspect(disk)
	if err != nil {
		return nil, err
	}
	rep = &Report{Disk: disk, Layout: layout}
	if _, ok := layout.Find(contract.PartitionName); !ok {
		// A plain base image: nothing of kiln's on it.
		if rep.OSSlots, err = osslots.Read(base.InPlace(disk, layout)); err != nil {
			rep.OSSlotsError = err.Error()
		}
		return rep, nil
	}
	fsys, closer, err := squashfs.OpenImagePartition(disk)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	f, err := fsys.Open(contract.ContentsFile)
	if err != nil {
		return nil, fmt.Errorf("%s: image partition has no %s: %w (not built by kiln, or damaged: reflash)", disk, contract.ContentsFile, err)
	}
	defer f.Close()
	rep.Contents, err = contract.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", disk, err)
	}
	rep.OSSlots = rep.Contents.OSSlots
	if rep.Trust, rep.ReleaseFiles, err = DiskRelease(disk); err != nil {
		return nil, err
	}
	rep.Sizes = map[string]int64{}
	for _, file := range rep.Contents.Files {
		top, _, _ := strings.Cut(file.Path, "/")
		rep.Sizes[top] += file.Size
	}
	return rep, nil
}

// VerifyOptions: see seal.VerifyOptions.
type VerifyOptions = seal.VerifyOptions

// Verify checks a disk image end to end: first every byte kiln wrote against
// the seal the build left in it (seal.Verify: both GPT copies,
// every partition, the image partition through its verity tree), then
// every file of the image partition against kiln.json, re-hashing every
// byte. The file check returns every problem found, not just the first.
func Verify(ctx context.Context, disk string, o VerifyOptions, p progress.Reporter) (rep *Report, err error) {
	defer recoverAs(&err, disk+": image partition")
	o.Upgradable, o.Progress = osslots.Upgradable, p
	sealed, err := seal.Verify(ctx, disk, o)
	var damaged *seal.VerifyError
	if errors.As(err, &damaged) {
		err = nameSecureBootFile(ctx, disk, o.Booted, err)
		return nil, fmt.Errorf("%s failed verification; the disk is damaged or was modified: rebuild or reflash it:\n  %w", disk, err)
	}
	if err != nil { // not a disk at all, unreadable, interrupted
		return nil, err
	}
	rep, err = Inspect(disk)
	if err != nil {
		return nil, err
	}
	// What upgrades rewrote, by what the node wrote (seal.Verify leaves it).
	var ukis []*bootentry.Entry
	if o.Booted && rep.Contents != nil && rep.Contents.SecureBoot != nil && len(sealed.Rewritten) > 0 {
		if ukis, err = ukiEntries(disk, rep.Layout); err != nil {
			return nil, err
		}
	}
	checked, unchecked, err := osslots.CheckBooted(ctx, disk, rep.Layout, rep.OSSlots, sealed.Rewritten, ukis)
	var booted *osslots.BootedError
	if errors.As(err, &booted) {
		return nil, fmt.Errorf("%s failed verification; the disk is damaged or was modified: rebuild or reflash it:\n  %w", disk, err)
	}
	if err != nil {
		return nil, err
	}
	sealed.Checked, sealed.Unchecked = append(sealed.Checked, checked...), append(sealed.Unchecked, unchecked...)
	if rep.Contents != nil && rep.Contents.SecureBoot != nil {
		var rootHash string
		if v := sealed.Seal.Image.Verity; v != nil {
			rootHash = v.RootHash
		}
		checked, unchecked, err := CheckSecureBoot(ctx, disk, rep.Layout, rep.Contents, rootHash, o.Booted)
		var sbe *SecureBootError
		if errors.As(err, &sbe) {
			return nil, fmt.Errorf("%s failed verification; the disk is damaged or was modified: rebuild or reflash it:\n  %w", disk, err)
		}
		if err != nil {
			return nil, err
		}
		sealed.Checked, sealed.Unchecked = append(sealed.Checked, checked...), append(sealed.Unchecked, unchecked...)
	}
	rep.Verified = sealed
	if rep.Contents == nil {
		return rep, fmt.Errorf("%s has no %s partition: nothing to verify", disk, contract.PartitionName)
	}
	fsys, closer, err := squashfs.OpenImagePartition(disk)
	if err != nil {
		return nil, err
	}
	defer closer.Close()

	var total int64
	listed := map[string]bool{contract.ContentsFile: true}
	for _, f := range rep.Contents.Files {
		total += f.Size
		listed[f.Path] = true
	}
	task := p.Task("verify "+disk, total)
	var problems []error
	for _, f := range rep.Contents.Files {
		if err := ctx.Err(); err != nil {
			task.Done(err)
			return nil, err
		}
		if err := VerifyFile(fsys, f, contract.ContentsFile, task); err != nil {
			problems = append(problems, err)
		}
	}
	// Nothing may be on the partition that kiln.json does not account for.
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && !listed[p] {
			problems = append(problems, fmt.Errorf("%s: not listed in %s", human.Quote(p), contract.ContentsFile))
		}
		return nil
	})
	if err != nil {
		problems = append(problems, fmt.Errorf("walk image partition: %w", err))
	}
	if len(problems) > 0 {
		sort.Slice(problems, func(i, j int) bool { return problems[i].Error() < problems[j].Error() })
		err := fmt.Errorf("%s failed verification (%d problems); the disk is damaged or was modified: rebuild or reflash it:\n  %w",
			disk, len(problems), errors.Join(problems...))
		task.Done(err)
		return rep, err
	}
	task.Done(nil)
	return rep, nil
}

// VerifyFile re-hashes one file of fsys against its listing (in listedIn,
// named in the errors), copying what it reads to w.
func VerifyFile(fsys fs.FS, f contract.File, listedIn string, w io.Writer) error {
	r, err := fsys.Open(path.Clean(f.Path))
	if err != nil {
		return fmt.Errorf("%s: missing: %w", human.Quote(f.Path), err)
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, w), r)
	if err != nil {
		return fmt.Errorf("%s: unreadable: %w", human.Quote(f.Path), err)
	}
	if n != f.Size {
		return fmt.Errorf("%s: size %d, %s says %d", human.Quote(f.Path), n, listedIn, f.Size)
	}
	if got := digest.NewDigest(digest.SHA256, h).String(); got != f.Digest {
		return fmt.Errorf("%s: digest %s, %s says %s", human.Quote(f.Path), got, listedIn, human.Quote(f.Digest))
	}
	return nil
}
