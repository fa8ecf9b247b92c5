// Package bundle writes kiln's field upgrade bundles (`kiln bundle`): the new
// release's images (all of them, or only the blobs the appliances lack), its
// release files and agent, behind a signed manifest, as a stick image (GPT,
// one partition) or a single file. It also inspects and verifies them. The
// format itself is systemd/contract/bundle, which the node reads.
package bundle

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/output"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/sqfswrite"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
)

// workDirPrefix names the staging trees in the cache directory.
const workDirPrefix = "bundle-"

// Output formats.
const (
	FormatImage = "image" // a stick image: GPT, one kiln-bundle partition
	FormatFile  = "file"  // the partition's bytes alone, for scp
)

// Options configure a bundle.
type Options struct {
	Output string
	Format string   // FormatImage (default) or FormatFile
	From   []string // releases the appliances run; none: a full bundle
	Key    string   // private key file (PKCS#8 PEM)
	// Agent is the kiln binary the release carries; empty: kiln-agent
	// beside this executable (refused when there is none).
	Agent           string
	CacheDir        string // blob cache; fetch.DefaultDir() when empty
	SourceDateEpoch int64  // 0: $SOURCE_DATE_EPOCH, else builder.DefaultSourceDateEpoch
	Progress        progress.Reporter
	Log             io.Writer
	Fetch           []fetch.Option
}

// Result is what Write wrote.
type Result struct {
	Output   string
	Size     int64
	Manifest *bundle.Manifest
	KeyID    string
	// Agent says which kiln the release's agent is (also when the
	// manifest's schema cannot say it).
	Agent version.Info
}

// Write builds the bundle for the recipe at recipePath from it and its lock.
// Like a build, it writes a temporary file beside the output and renames it
// only once complete; on any error nothing is left and an existing output
// is untouched.
func Write(ctx context.Context, recipePath string, o Options) (res *Result, err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Progress == nil {
		o.Progress = progress.Discard()
	}
	if o.Format == "" {
		o.Format = FormatImage
	}
	if o.Format != FormatImage && o.Format != FormatFile {
		return nil, fmt.Errorf("format %q: want %s or %s", o.Format, FormatImage, FormatFile)
	}
	epoch, err := builder.SourceDateEpoch(o.SourceDateEpoch)
	if err != nil {
		return nil, err
	}
	priv, err := readPrivateKey(o.Key)
	if err != nil {
		return nil, err
	}
	r, err := recipes.Load(recipePath)
	if err != nil {
		return nil, err
	}
	if len(r.Trust) == 0 {
		return nil, fmt.Errorf("%s: the recipe has no trust keys, so its appliances would accept no bundle: add \"trust: [NAME.pub]\" (kiln key generate) and build the appliance with it", r.Path)
	}
	if err := checkReleaseInputs(r); err != nil {
		return nil, err
	}
	lock, err := readFreshLock(r)
	if err != nil {
		return nil, err
	}
	lockBytes, err := lock.Encode()
	if err != nil {
		return nil, err
	}
	agent, err := builder.FindAgent(ctx, o.Agent, r.Arch)
	if err != nil {
		return nil, err
	}
	inputs := append(output.RecipeInputs(r), output.Input{What: "the signing key (--key)", Path: o.Key},
		output.Input{What: "the agent binary the bundle carries", Path: agent.Path})
	for _, f := range o.From {
		inputs = append(inputs, output.Input{What: "a release given with --from", Path: f})
	}
	if err := output.Check(o.Output, "upgrade.img", inputs); err != nil {
		return nil, err
	}
	trust, err := builder.TrustKeys(r)
	if err != nil {
		return nil, err
	}

	cacheDir := o.CacheDir
	if cacheDir == "" {
		cacheDir = fetch.DefaultDir()
	}
	cache, err := fetch.Open(cacheDir)
	if err != nil {
		return nil, err
	}
	var bases []*base
	for _, f := range o.From {
		b, err := loadBase(ctx, f, cache, o)
		if err != nil {
			return nil, err
		}
		if err := checkBase(r, b); err != nil {
			return nil, err
		}
		bases = append(bases, b)
	}
	keyID, err := checkSigner(priv, trust, bases)
	if err != nil {
		return nil, err
	}

	images, err := fetchRelease(ctx, cache, r, lock, o)
	if err != nil {
		return nil, err
	}
	m := &bundle.Manifest{
		SchemaVersion: bundle.SchemaVersion,
		Recipe:        r.Name,
		Version:       r.Version,
		Arch:          r.Arch,
		LockDigest:    digestOf(lockBytes),
		Created:       epoch,
		Kiln:          version.Current(),
		Kind:          bundle.KindFull,
		AgentVersion:  agent.Version,
	}
	for _, b := range bases {
		m.Kind = bundle.KindDelta
		if !slices.Contains(m.AppliesTo, b.release) {
			m.AppliesTo = append(m.AppliesTo, b.release)
		}
		// Written for nodes whose agent reads no newer schema: schema 1
		// lacks only the records of which kiln made it and which agent
		// it carries.
		m.SchemaVersion = min(m.SchemaVersion, b.schema)
	}
	if m.SchemaVersion == 1 {
		m.Kiln, m.AgentVersion = version.Info{}, version.Info{}
	}
	sort.Slice(m.AppliesTo, func(i, j int) bool { return m.AppliesTo[i].Version < m.AppliesTo[j].Version })
	// The delta applies to every base, so it leaves out only what every
	// base holds: a node of any of them lacks nothing.
	held := func(d string) bool {
		for _, b := range bases {
			if !b.blobs[d] {
				return false
			}
		}
		return len(bases) > 0
	}
	layers := describeImages(m, r, images, held)
	agentDigest, agentSize, err := stage.HashFile(agent.Path)
	if err != nil {
		return nil, fmt.Errorf("agent binary: %w", err)
	}
	m.Agent = bundle.File{Path: bundle.AgentBinary, Size: agentSize, Digest: agentDigest}
	m.AgentOnStick = len(bases) == 0
	for _, b := range bases {
		m.AgentOnStick = m.AgentOnStick || b.agent != agentDigest
	}
	for _, k := range trust {
		tk, err := bundle.TrustedKey(k)
		if err != nil {
			return nil, err
		}
		m.Trust = append(m.Trust, tk)
	}
	if m.Space.CopyBytes == 0 && len(r.Release.Files) == 0 {
		var from []string
		for _, b := range bases {
			from = append(from, b.release.Version)
		}
		return nil, fmt.Errorf("the bundle would be empty: %s %s has no blob that %s lacks and no release files; nothing to upgrade", r.Name, r.Version, strings.Join(from, ", "))
	}

	// The staging tree lives in the cache directory so blobs are hard links.
	workDir := output.Work{Dir: cacheDir, Prefix: workDirPrefix}
	output.Sweep(o.Output, "bundle run", o.Log, workDir)
	work, err := output.MkdirWork(workDir)
	if err != nil {
		return nil, fmt.Errorf("staging directory: %w", err)
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "tree")
	if err := stageTree(ctx, tree, cache, r, images, agent.Path, m, layers, o); err != nil {
		return nil, err
	}

	out, err := output.Create(o.Output)
	if err != nil {
		return nil, err
	}
	defer out.Discard()
	size, err := writeBundle(ctx, out.File, tree, m, priv, epoch, o)
	if err != nil {
		return nil, err
	}
	if err := out.Commit(ctx); err != nil {
		return nil, err
	}
	return &Result{Output: o.Output, Size: size, Manifest: m, KeyID: keyID, Agent: agent.Version}, nil
}

// checkBase refuses a --from the new release cannot follow.
func checkBase(r *recipes.Recipe, b *base) error {
	if b.recipe != r.Name {
		return fmt.Errorf("--from %s is recipe %q, the bundle is for %q: give a release of the same appliance", b.from, b.recipe, r.Name)
	}
	if b.arch != r.Arch {
		return fmt.Errorf("--from %s is for %s, the recipe for %s: give a release of the same arch", b.from, b.arch, r.Arch)
	}
	c, err := contract.CompareVersions(r.Version, b.release.Version)
	if err != nil {
		return fmt.Errorf("--from %s: %w", b.from, err)
	}
	if c <= 0 {
		return fmt.Errorf("recipe version %s is not newer than --from %s (%s): raise version in %s; nodes refuse a downgrade or a replay", r.Version, b.from, b.release.Version, r.Path)
	}
	return nil
}

// checkSigner makes sure the nodes will accept the signature: every --from
// release that says whom its nodes trust (a bundle; a lock, through its
// recipe) must trust the key — that is how a release rotates keys: signed
// with the old key, it carries the new set. When no --from says, the key
// must be in the new recipe's trust.
func checkSigner(priv ed25519.PrivateKey, trust []ed25519.PublicKey, bases []*base) (string, error) {
	pub := priv.Public().(ed25519.PublicKey)
	id, err := bundle.KeyID(pub)
	if err != nil {
		return "", err
	}
	known := false
	for _, b := range bases {
		if b.trust == nil {
			continue
		}
		known = true
		if !trusts(b.trust, pub) {
			return "", fmt.Errorf("signing key %s is not trusted by the nodes running %s (--from %s), so they would refuse the bundle: sign with a key they trust (to rotate keys, sign with the old key and list the new one under trust)", id, b.release.Version, b.from)
		}
	}
	if !known && !trusts(trust, pub) {
		return "", fmt.Errorf("signing key %s is not in the recipe's trust, so the appliances would refuse the bundle: sign with a trusted key, or add its .pub to trust", id)
	}
	return id, nil
}

func trusts(keys []ed25519.PublicKey, pub ed25519.PublicKey) bool {
	return slices.ContainsFunc(keys, func(k ed25519.PublicKey) bool { return k.Equal(pub) })
}

func readPrivateKey(p string) (ed25519.PrivateKey, error) {
	if p == "" {
		return nil, fmt.Errorf("no signing key: pass --key NAME.key (make one with `kiln key generate NAME`)")
	}
	data, err := inputfile.ReadFile(p, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	k, err := bundle.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", p, err)
	}
	return k, nil
}

// checkReleaseInputs checks the files a bundle reads from the recipe: trust
// keys and release files (the base image is not needed).
func checkReleaseInputs(r *recipes.Recipe) error {
	err := r.CheckFiles()
	var list recipes.ErrorList
	if !errors.As(err, &list) {
		return err
	}
	var keep recipes.ErrorList
	for _, e := range list {
		if e.Field != "base.path" {
			keep = append(keep, e)
		}
	}
	if len(keep) > 0 {
		return keep
	}
	return nil
}

// readFreshLock reads the recipe's lock and refuses a missing or stale one:
// a bundle ships exactly what was locked (and, usually, built and tested).
func readFreshLock(r *recipes.Recipe) (*recipes.Lock, error) {
	p := recipes.LockPath(r.Path)
	lock, err := recipes.ReadLock(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no lock file %s: run `kiln lock %s` (and build the release) first", p, r.Path)
		}
		return nil, err
	}
	if err := lock.Check(r); err != nil {
		return nil, err
	}
	return lock, nil
}

func fetchRelease(ctx context.Context, cache *fetch.Cache, r *recipes.Recipe, lock *recipes.Lock, o Options) ([]*fetch.Image, error) {
	var reqs []fetch.Request
	for _, img := range r.Images {
		li, _ := lock.Image(img.Name) // lock.Check made sure every image is there
		reqs = append(reqs, fetch.Request{Source: li.Source, BaseDir: r.Dir, Digest: li.Digest, Platform: v1.Platform{OS: "linux", Architecture: r.Arch}})
	}
	return cache.FetchAll(ctx, reqs, o.Progress, o.Fetch...)
}

// describeImages fills the manifest's images, blobs and space (all but the
// unpacked sizes, filled by stageTree) and returns the layers on the stick.
func describeImages(m *bundle.Manifest, r *recipes.Recipe, images []*fetch.Image, held func(string) bool) map[string]bool {
	blobs := map[string]bundle.Blob{}
	layers := map[string]bool{}
	add := func(d v1.Descriptor) {
		k := d.Digest.String()
		if _, ok := blobs[k]; !ok {
			blobs[k] = bundle.Blob{Digest: k, Size: d.Size, MediaType: string(d.MediaType), OnStick: !held(k)}
		}
	}
	for i, img := range images {
		ri := r.Images[i]
		add(img.Descriptor)
		mi := bundle.Image{Image: contract.Image{
			Name: ri.Name, Digest: img.Descriptor.Digest.String(), MediaType: string(img.Descriptor.MediaType),
			Size: img.Descriptor.Size, Served: ri.Served(), Preloaded: ri.Preloaded(), ImageID: img.Config.Digest.String(),
		}}
		for _, d := range img.Blobs() {
			add(d)
			mi.Size += d.Size
			mi.Blobs = append(mi.Blobs, d.Digest.String())
		}
		for _, l := range img.Layers {
			if blobs[l.Digest.String()].OnStick {
				layers[l.Digest.String()] = true
			}
		}
		m.Images = append(m.Images, mi)
	}
	sort.Slice(m.Images, func(i, j int) bool { return m.Images[i].Name < m.Images[j].Name })
	for _, b := range blobs {
		m.Blobs = append(m.Blobs, b)
		if b.OnStick {
			m.Space.CopyBytes += b.Size
		}
	}
	sort.Slice(m.Blobs, func(i, j int) bool { return m.Blobs[i].Digest < m.Blobs[j].Digest })
	return layers
}

// writeBundle writes header and filesystem (and, for an image, the GPT) into
// out and returns its size. kiln lays the squashfs out itself (sqfswrite),
// so its size and every file's offset are known before a byte is written:
// the header is sized from the manifest with only the metadata digest a
// placeholder of the same length, and the filesystem is written once, in
// place, each file's contents copied by the kernel.
func writeBundle(ctx context.Context, out *os.File, tree string, m *bundle.Manifest, priv ed25519.PrivateKey, epoch int64, o Options) (int64, error) {
	plan, err := sqfswrite.Scan(tree, sqfswrite.WithModTime(epoch))
	if err != nil {
		return 0, fmt.Errorf("bundle filesystem: %w", err)
	}
	if err := placeFiles(m, plan.Files()); err != nil {
		return 0, err
	}
	m.Filesystem = bundle.Filesystem{Size: plan.Size(), Metadata: "sha256:" + strings.Repeat("0", 64)}
	placeholder, err := bundle.Sign(m, priv)
	if err != nil {
		return 0, err
	}
	hdrSize := bundle.HeaderSize(len(placeholder))
	start := int64(0)
	if o.Format == FormatImage {
		start = gpt.StickStart
	}
	task := o.Progress.Task("write bundle filesystem", plan.DataBytes())
	err = plan.Write(ctx, out, start+hdrSize, task)
	task.Done(err)
	if err != nil {
		return 0, err
	}
	// The files' contents are pinned by the digests the manifest has
	// already (the blobs are named by theirs): only the bytes around them
	// are read back and hashed, a few MiB of squashfs tables.
	task = o.Progress.Task("hash bundle filesystem metadata", 0)
	m.Filesystem.Metadata, err = m.HashMetadata(out, start+hdrSize, task)
	task.Done(err)
	if err != nil {
		return 0, err
	}
	if err := m.Validate(); err != nil {
		return 0, fmt.Errorf("kiln bug: %w", err)
	}
	env, err := bundle.Sign(m, priv)
	if err != nil {
		return 0, err
	}
	hdr, err := bundle.EncodeHeader(env, hdrSize)
	if err != nil {
		return 0, fmt.Errorf("kiln bug: %w", err)
	}
	if _, err := out.WriteAt(hdr, start); err != nil {
		return 0, fmt.Errorf("write bundle header: %w", err)
	}
	content := hdrSize + plan.Size()
	if o.Format == FormatFile {
		return content, nil
	}
	if err := gpt.WriteStick(out, content, bundle.PartitionType, bundle.PartitionName, guidSeed(env)); err != nil {
		return 0, err
	}
	return gpt.StickSize(content), nil
}

// placeFiles sets each manifest file's offset from the filesystem's layout;
// the two lists must name the same files with the same sizes.
func placeFiles(m *bundle.Manifest, files []sqfswrite.File) error {
	at := map[string]sqfswrite.File{}
	for _, f := range files {
		at[f.Path] = f
	}
	if len(at) != len(m.Files) {
		return fmt.Errorf("kiln bug: the bundle filesystem holds %d files, the manifest lists %d", len(at), len(m.Files))
	}
	for i, f := range m.Files {
		placed, ok := at[f.Path]
		if !ok || placed.Size != f.Size {
			return fmt.Errorf("kiln bug: %s (%d bytes) is not in the bundle filesystem as listed", f.Path, f.Size)
		}
		m.Files[i].Offset = placed.Offset
	}
	return nil
}

// guidSeed derives the stick's GUIDs from the signed envelope: the same
// bundle gives the same stick image.
func guidSeed(envelope []byte) []byte {
	s := sha256.Sum256(envelope)
	return s[:]
}

func digestOf(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }
