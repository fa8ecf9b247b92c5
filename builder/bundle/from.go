package bundle

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/internal/version"
	pbase "github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// priorRelease is a release the appliances run, named by --from, that a
// delta applies to (not the vendor disk a recipe builds on): what it is and
// which blobs a node running it holds.
type priorRelease struct {
	from    string // as given
	recipe  string
	arch    string
	release contract.ReleaseID
	blobs   map[string]bool
	trust   []ed25519.PublicKey // keys its nodes trust, when known
	agent   string              // digest of the agent its nodes run, when known
	// schema is the newest manifest schema its nodes' agent reads: 1 when
	// the release says it was made before schema 2 (a kiln.json without
	// the kiln record, a schema 1 bundle), else this kiln's.
	schema int

	// Where its OS is told (read only when the new release has one, by
	// loadOS): the slots its kiln.json records (a disk, a kiln.json), the
	// disk, a bundle's manifest and where its filesystem starts, a lock's
	// recipe's base image.
	slots    *contract.OSSlots
	disk     string
	manifest *bundlefmt.Manifest
	fsOffset int64
	lockBase string
	os       *priorOS
	// imagesRootHash is a Secure Boot disk's image partition's root hash
	// (its signed images carry it): the bundle's images must name it.
	imagesRootHash string
}

// loadPrior reads a --from argument: a kiln disk, its kiln.json, a bundle
// (stick image or file), or a lock file with its recipe beside it.
func (b *bundler) loadPrior(ctx context.Context, p string) (*priorRelease, error) {
	head := make([]byte, 8)
	f, err := inputfile.Open(p)
	if err != nil {
		return nil, fmt.Errorf("--from: %w", err)
	}
	n, _ := f.Read(head)
	f.Close()
	head = head[:n]
	var rel *priorRelease
	switch {
	case string(head) == bundlefmt.Magic:
		rel, err = priorFromBundle(p, 0)
	case bytes.HasPrefix(bytes.TrimSpace(head), []byte("{")):
		rel, err = priorFromContents(p)
	default:
		if l, lerr := gpt.Inspect(p); lerr == nil {
			rel, err = priorFromDisk(p, l)
		} else if isLock(p) {
			rel, err = b.priorFromLock(ctx, p)
		} else {
			err = errors.New("not a kiln disk, kiln.json, bundle or lock file")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--from %s: %w", p, err)
	}
	rel.from = p
	return rel, nil
}

func priorFromDisk(p string, l *gpt.Layout) (*priorRelease, error) {
	for _, part := range l.Partitions {
		if strings.EqualFold(part.Type, bundlefmt.PartitionType) {
			return priorFromBundle(p, part.Offset)
		}
	}
	if _, ok := l.Find(contract.PartitionName); !ok {
		return nil, fmt.Errorf("a disk with no %s partition: give a disk kiln built, its kiln.json, a bundle or a lock file", contract.PartitionName)
	}
	fsys, closer, err := squashfs.OpenImagePartition(p)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	f, err := fsys.Open(contract.ContentsFile)
	if err != nil {
		return nil, fmt.Errorf("image partition has no %s: %w", contract.ContentsFile, err)
	}
	defer f.Close()
	c, err := contract.Decode(f)
	if err != nil {
		return nil, err
	}
	b := priorOfContents(c)
	b.disk = p
	if c.SecureBoot != nil {
		if b.imagesRootHash, err = secureBootDisk(p, l, c); err != nil {
			return nil, err
		}
	}
	b.trust, err = diskTrust(p)
	return b, err
}

// diskTrust reads the keys a disk's nodes trust from its Ignition config
// (the files under contract.TrustDir, as the factory build writes them); nil
// when it trusts none (built before trust existed, or without it).
func diskTrust(disk string) ([]ed25519.PublicKey, error) {
	trust, _, err := builder.DiskRelease(disk)
	if err != nil {
		return nil, err
	}
	var keys []ed25519.PublicKey
	for _, k := range trust {
		pub, err := bundlefmt.ParsePublicKey([]byte(k.PublicKey))
		if err != nil {
			return nil, err
		}
		keys = append(keys, pub)
	}
	return keys, nil
}

func priorFromContents(p string) (*priorRelease, error) {
	f, err := inputfile.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := contract.Decode(f)
	if err != nil {
		return nil, err
	}
	return priorOfContents(c), nil
}

// priorOfContents: a node holds the blobs of its image partition's layout.
// (Images only preloaded are in containers/storage, not as blobs, so a
// delta carries their blobs again.)
func priorOfContents(c *contract.Contents) *priorRelease {
	b := &priorRelease{recipe: c.Recipe, arch: c.Arch, release: contract.ReleaseID{Version: c.Version, LockDigest: c.LockDigest}, blobs: map[string]bool{}, schema: bundlefmt.SchemaVersion, slots: c.OSSlots}
	if c.Kiln == (version.Info{}) {
		b.schema = 1
	}
	prefix := path.Join(contract.OCIDir, "blobs", "sha256") + "/"
	for _, f := range c.Files {
		if hex, ok := strings.CutPrefix(f.Path, prefix); ok {
			b.blobs[digest.NewDigestFromEncoded(digest.SHA256, hex).String()] = true
		}
		if f.Path == contract.AgentBinary {
			b.agent = f.Digest
		}
	}
	return b
}

// priorFromBundle: a node that installed a bundle holds every blob of its
// release, whether the bundle was full or a delta. The bundle is not
// verified here: it is the factory's own output, named on its command line.
func priorFromBundle(p string, offset int64) (*priorRelease, error) {
	f, err := inputfile.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, err := bundlefmt.ReadHeader(io.NewSectionReader(f, offset, toEnd))
	if err != nil {
		return nil, err
	}
	m, _, err := bundlefmt.Unverified(h.Envelope)
	if err != nil {
		return nil, err
	}
	// A schema 1 bundle was made for agents before schema 2; any later one
	// by a kiln whose agent reads its own schema, as a kiln.json's.
	schema := bundlefmt.SchemaVersion
	if m.SchemaVersion == 1 {
		schema = 1
	}
	b := &priorRelease{recipe: m.Recipe, arch: m.Arch, release: contract.ReleaseID{Version: m.Version, LockDigest: m.LockDigest}, blobs: map[string]bool{}, agent: m.Agent.Digest, schema: schema,
		manifest: m, fsOffset: offset + h.Size}
	for _, bl := range m.Blobs {
		b.blobs[bl.Digest] = true
	}
	for _, k := range m.Trust {
		pub, err := bundlefmt.ParsePublicKey([]byte(k.PublicKey))
		if err != nil {
			return nil, fmt.Errorf("trusted key %s: %w", k.KeyID, err)
		}
		b.trust = append(b.trust, pub)
	}
	return b, nil
}

// isLock tells a lock file by its kind line (ReadLock then says what else
// is wrong with it).
func isLock(p string) bool {
	data, err := inputfile.ReadFile(p, 1<<20)
	return err == nil && bytes.Contains(data, []byte("kind: "+recipes.KindLock))
}

// priorFromLock reads a lock and the recipe beside it (for the recipe's name,
// version and trust); the blobs come from the images' manifests, fetched
// into the cache if they are not there yet.
func (b *bundler) priorFromLock(ctx context.Context, p string) (rel *priorRelease, err error) {
	lock, err := recipes.ReadLock(p)
	if err != nil {
		return nil, err
	}
	r, err := recipeBeside(p)
	if err != nil {
		return nil, err
	}
	defer func() {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w; --from a lock reads the old release's recipe beside it, and that recipe's files "+
				"(trust keys, base, local layouts) where it names them, relative to it: keep the old release's "+
				"directory whole (a copy, or a checkout of its tag), or give --from that release's disk, "+
				"kiln.json or bundle instead", err)
		}
	}()
	if err := lock.Check(r); err != nil {
		return nil, err
	}
	lockBytes, err := lock.Encode()
	if err != nil {
		return nil, err
	}
	imgs, err := b.fetch(ctx, r, lock.Images)
	if err != nil {
		return nil, builder.LockError(lock, err)
	}
	rel = &priorRelease{recipe: r.Name, arch: r.Arch, release: contract.ReleaseID{Version: r.Version, LockDigest: digest.FromBytes(lockBytes).String()}, blobs: map[string]bool{}, schema: bundlefmt.SchemaVersion,
		lockBase: r.Resolve(r.Base.Path)}
	for _, img := range imgs {
		rel.blobs[img.Descriptor.Digest.String()] = true
		for _, d := range img.Blobs() {
			rel.blobs[d.Digest.String()] = true
		}
	}
	rel.trust, err = builder.TrustKeys(r)
	return rel, err
}

// recipeBeside finds the recipe a lock file belongs to (NAME.lock beside
// NAME.yaml or NAME.yml).
func recipeBeside(lockPath string) (*recipes.Recipe, error) {
	stem := strings.TrimSuffix(lockPath, ".lock")
	for _, ext := range []string{".yaml", ".yml"} {
		if _, err := os.Stat(stem + ext); err == nil {
			return recipes.Load(stem + ext)
		}
	}
	return nil, errors.New("no recipe beside the lock file (" + path.Base(stem) + ".yaml): a lock alone does not say which release it is")
}

// loadOS learns what the prior release's nodes hold of the OS, for a bundle with an
// OS section: what their active usr slot holds (cut from a disk or a lock's
// base image, read from a bundle), or at least its root hash (a kiln.json), and
// their kernel and initramfs; that they have no slots at all; or nothing
// (a bundle made before OS sections), which makes the pack carry it all.
func (b *bundler) loadOS(ctx context.Context, rel *priorRelease) (*priorOS, error) {
	switch {
	case rel.manifest != nil:
		m := rel.manifest
		if m.OS == nil {
			return &priorOS{none: m.SchemaVersion >= bundlefmt.OSSchemaVersion}, nil
		}
		f, err := inputfile.Open(rel.from)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		x, err := m.ReadSlotIndex(f, rel.fsOffset, m.OS.Usr.Index)
		if err != nil {
			return nil, err
		}
		o := &priorOS{rootHash: m.OS.Usr.Verity.RootHash, index: x, boot: map[string]bool{}}
		for _, bf := range append([]bundlefmt.BootFile{m.OS.Entry.Kernel}, m.OS.Entry.Initrd...) {
			o.boot[bf.Digest] = true
		}
		return o, nil
	case rel.lockBase != "":
		if _, err := os.Stat(rel.lockBase); err != nil {
			return &priorOS{}, nil // not at hand: nothing known
		}
		return b.readPriorOS(ctx, rel.lockBase, "")
	case rel.slots == nil:
		return &priorOS{none: true}, nil
	case rel.disk != "" && rel.imagesRootHash != "":
		return b.readSecureBootPriorOS(ctx, rel.disk, rel.slots)
	case rel.disk != "":
		return b.readPriorOS(ctx, rel.disk, rel.slots.RootHash)
	default: // a kiln.json
		return &priorOS{rootHash: rel.slots.RootHash}, nil
	}
}

// readSecureBootPriorOS reads the OS of a prior release's Secure Boot
// disk: its entries are signed images, not text entries with their kernel
// beside them, so its active slot is the one kiln.json's slots say (proven
// against their root hash) and its nodes hold no kernel or initramfs file
// (the stick carries them).
func (b *bundler) readSecureBootPriorOS(ctx context.Context, disk string, slots *contract.OSSlots) (*priorOS, error) {
	dir, err := b.workDir("base-os")
	if err != nil {
		return nil, err
	}
	d, err := pbase.OpenDisk(disk, dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	rel := &osRelease{slots: slots}
	if err := rel.readActiveSlot(ctx, d); err != nil {
		return nil, err
	}
	return osOfRelease(rel), nil
}

// readPriorOS reads the OS of a prior release's disk (its kiln.json saying rootHash,
// when not "").
func (b *bundler) readPriorOS(ctx context.Context, disk, rootHash string) (*priorOS, error) {
	dir, err := b.workDir("base-os")
	if err != nil {
		return nil, err
	}
	rel, err := readOSRelease(ctx, disk, dir, progress.Discard())
	if err != nil {
		return nil, err
	}
	if rel == nil {
		return osOfRelease(nil), nil
	}
	rel.closer()
	if rootHash != "" && rel.verity.RootHash != rootHash {
		return nil, fmt.Errorf("its kiln.json says its OS slot's root hash is %s, its boot entry %s", rootHash, rel.verity.RootHash)
	}
	return osOfRelease(rel), nil
}
