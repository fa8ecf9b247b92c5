// Package bundle writes kiln's field upgrade bundles (`kiln bundle`): the new
// release's images (all of them, or only the blobs the appliances lack), its
// release files and agent, behind a signed manifest, as a stick image (GPT,
// one partition) or a single file. It also inspects and verifies them. The
// format itself is systemd/contract/bundlefmt, which the node reads.
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
	"slices"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/output"
	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/sqfswrite"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
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
	// SecureBootKey is the db private key (db.key) that signs the
	// release's unified kernel images, for a recipe with secureBoot.
	SecureBootKey string
}

// Result is what Write wrote.
type Result struct {
	Output   string
	Size     int64
	Manifest *bundlefmt.Manifest
	KeyID    string
	// Agent says which kiln the release's agent is (also when the
	// manifest's schema cannot say it).
	Agent version.Info
}

// Write builds the bundle for the recipe at recipePath from it and its lock.
// Like a build, it writes a temporary file beside the output and renames it
// only once complete (builder/output); on any error nothing is left and an
// existing output is untouched.
func Write(ctx context.Context, recipePath string, o Options) (*Result, error) {
	b, err := newBundler(ctx, recipePath, o)
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	for _, step := range []func(context.Context) error{
		b.checkSecureBoot,
		b.makeWorkDir,
		b.readOS,
		b.loadPriors,
		b.fetchImages,
		b.describeRelease,
		b.describeImages,
		b.describeOS,
		b.describeAgent,
		b.stageImages,
		b.stageOS,
		b.signUKIs,
		b.stageFiles,
		b.writeBundle,
		b.commit,
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return &Result{Output: o.Output, Size: b.size, Manifest: b.m, KeyID: b.keyID, Agent: b.Agent.Version}, nil
}

// bundler is one run of Write. Each step is a method that reads what the
// steps before it left on the struct and adds its own result, in the order
// Write calls them (as builder's build).
type bundler struct {
	*builder.Run // the recipe, the timestamp, the agent the release carries
	o            Options
	priv         ed25519.PrivateKey
	lock         *recipes.Lock
	lockBytes    []byte
	trust        []ed25519.PublicKey // the keys the release's nodes will trust
	cache        *fetch.Cache

	priors []*priorRelease // the releases given with --from
	keyID  string
	images []*fetch.Image // the release's, in recipe order
	m      *bundlefmt.Manifest
	layers map[string]bool // the layers on the stick, by digest
	work   string          // the staging directory, in the cache directory
	tree   string          // the bundle's filesystem, under work
	out    *output.File
	size   int64

	os         *osRelease             // the new release's OS, nil when its base has no slots
	osIndexes  map[string]*slot.Index // the slot indexes the stick carries, by digest
	packPriors []*slot.Index          // what each prior release's active slot holds (nil: not known)
	closers    []func()
	dbCert     string // the recipe's db certificate, when it has secureBoot
}

// newBundler reads and checks everything that needs no long work: the
// signing key, the recipe and the files it names (the base image too: it is
// the release's OS, which a bundle carries when it has A/B slots), the
// agent, the lock, and the output against all of them.
func newBundler(ctx context.Context, recipePath string, o Options) (*bundler, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Progress == nil {
		o.Progress = progress.Discard()
	}
	if o.Format == "" {
		o.Format = FormatImage
	}
	if o.CacheDir == "" {
		o.CacheDir = fetch.DefaultDir()
	}
	if o.Format != FormatImage && o.Format != FormatFile {
		return nil, fmt.Errorf("format %q: want %s or %s", o.Format, FormatImage, FormatFile)
	}
	priv, err := readPrivateKey(o.Key)
	if err != nil {
		return nil, err
	}
	run, err := builder.StartRun(ctx, recipePath, builder.RunOptions{Agent: o.Agent, SourceDateEpoch: o.SourceDateEpoch})
	if err != nil {
		return nil, err
	}
	b := &bundler{Run: run, o: o, priv: priv}
	r := b.Recipe
	if len(r.Trust) == 0 {
		return nil, fmt.Errorf("%s: the recipe has no trust keys, so its appliances would accept no bundle: add \"trust: [NAME.pub]\" (kiln key generate) and build the appliance with it", r.Path)
	}
	if b.lock, err = readFreshLock(r); err != nil {
		return nil, err
	}
	if b.lockBytes, err = b.lock.Encode(); err != nil {
		return nil, err
	}
	inputs := b.Inputs("the agent binary the bundle carries", output.Input{What: "the signing key (--key)", Path: o.Key})
	for _, f := range o.From {
		inputs = append(inputs, output.Input{What: "a release given with --from", Path: f})
	}
	if err := output.Check(o.Output, "upgrade.img", inputs); err != nil {
		return nil, err
	}
	if b.trust, err = builder.TrustKeys(r); err != nil {
		return nil, err
	}
	if b.cache, err = fetch.Open(o.CacheDir); err != nil {
		return nil, err
	}
	return b, nil
}

// cleanup removes the staging tree and, unless commit ran, the temporary
// output.
func (b *bundler) cleanup() {
	for _, c := range b.closers {
		c()
	}
	if b.work != "" {
		os.RemoveAll(b.work)
	}
	b.out.Discard()
}

// onCleanup runs fn when the run ends.
func (b *bundler) onCleanup(fn func()) { b.closers = append(b.closers, fn) }

// workDir is a new directory in the staging directory.
func (b *bundler) workDir(name string) (string, error) {
	return os.MkdirTemp(b.work, name+"-")
}

// loadPriors reads the releases given with --from, and checks that the new
// release can follow each and that their nodes trust the signing key.
func (b *bundler) loadPriors(ctx context.Context) error {
	for _, f := range b.o.From {
		rel, err := b.loadPrior(ctx, f)
		if err != nil {
			return err
		}
		if err := checkPrior(b.Recipe, rel); err != nil {
			return err
		}
		if b.os != nil {
			if rel.os, err = b.loadOS(ctx, rel); err != nil {
				return fmt.Errorf("--from %s: its OS: %w", f, err)
			}
			if rel.os.none {
				return fmt.Errorf("--from %s: its nodes have no OS slots (their base had none), so they cannot take the OS of %s %s: reflash them with it (kiln reflash-stick)", f, b.Recipe.Name, b.Recipe.Version)
			}
		}
		b.priors = append(b.priors, rel)
	}
	var err error
	b.keyID, err = checkSigner(b.priv, b.trust, b.priors)
	return err
}

// fetchImages brings every locked image of the release into the cache,
// verified, in the recipe's order.
func (b *bundler) fetchImages(ctx context.Context) error {
	locked, err := builder.LockedImages(b.Recipe, b.lock)
	if err != nil {
		return err
	}
	b.images, err = b.fetch(ctx, b.Recipe, locked)
	return builder.LockError(b.lock, err)
}

// fetch brings the locked images of r into the cache, verified.
func (b *bundler) fetch(ctx context.Context, r *recipes.Recipe, images []recipes.LockedImage) ([]*fetch.Image, error) {
	var reqs []fetch.Request
	for _, li := range images {
		reqs = append(reqs, builder.FetchRequest(r, li))
	}
	return b.cache.FetchAll(ctx, reqs, b.o.Progress, b.o.Fetch...)
}

// describeRelease starts the manifest: which release this is and, for a
// delta, which it applies to, in the newest schema every prior release's nodes read.
func (b *bundler) describeRelease(context.Context) error {
	r := b.Recipe
	m := &bundlefmt.Manifest{
		SchemaVersion: bundlefmt.NoOSSchemaVersion,
		Recipe:        r.Name,
		Version:       r.Version,
		Arch:          r.Arch,
		LockDigest:    digest.FromBytes(b.lockBytes).String(),
		Created:       b.Epoch,
		Kiln:          version.Current(),
		Kind:          bundlefmt.KindFull,
		AgentVersion:  b.Agent.Version,
	}
	for _, rel := range b.priors {
		m.Kind = bundlefmt.KindDelta
		if !slices.Contains(m.AppliesTo, rel.release) {
			m.AppliesTo = append(m.AppliesTo, rel.release)
		}
		// Written for nodes whose agent reads no newer schema: schema 1
		// lacks only the records of which kiln made it and which agent
		// it carries.
		m.SchemaVersion = min(m.SchemaVersion, rel.schema)
	}
	if b.os != nil {
		// An OS section needs schema 3; nodes whose agent reads less
		// would refuse it anyway (as made by a newer kiln).
		m.SchemaVersion = bundlefmt.OSSchemaVersion
		for _, rel := range b.priors {
			if rel.schema < bundlefmt.OSSchemaVersion {
				return fmt.Errorf("--from %s: its nodes run an agent that reads bundle schemas up to %d, and the OS of %s %s needs schema %d: upgrade them first with a bundle made by a kiln of their time, whose release brings a newer agent",
					rel.from, rel.schema, r.Name, r.Version, bundlefmt.OSSchemaVersion)
			}
		}
	}
	if m.SchemaVersion == 1 {
		m.Kiln, m.AgentVersion = version.Info{}, version.Info{}
	}
	sort.Slice(m.AppliesTo, func(i, j int) bool { return m.AppliesTo[i].Version < m.AppliesTo[j].Version })
	b.m = m
	return nil
}

// describeImages fills the manifest's images, blobs and space (all but the
// unpacked sizes, filled by stageImages) and finds the layers on the stick.
func (b *bundler) describeImages(context.Context) error {
	m := b.m
	blobs := map[string]bundlefmt.Blob{}
	layers := map[string]bool{}
	add := func(d v1.Descriptor) {
		k := d.Digest.String()
		if _, ok := blobs[k]; !ok {
			blobs[k] = bundlefmt.Blob{Digest: k, Size: d.Size, MediaType: string(d.MediaType), OnStick: !b.held(k)}
		}
	}
	for i, img := range b.images {
		ri := b.Recipe.Images[i]
		add(img.Descriptor)
		mi := bundlefmt.Image{Image: builder.DescribeImage(ri, img)}
		for _, d := range img.Blobs() {
			add(d)
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
	b.layers = layers
	return nil
}

// held says whether every prior release holds blob d: the delta applies to every
// prior release, so it leaves out only what every one holds (a node of any of
// them lacks nothing).
func (b *bundler) held(d string) bool {
	for _, rel := range b.priors {
		if !rel.blobs[d] {
			return false
		}
	}
	return len(b.priors) > 0
}

// describeAgent records the agent the release runs (on the stick unless
// every base runs this very one) and the keys its nodes will trust, and
// refuses a bundle that would carry nothing to upgrade.
func (b *bundler) describeAgent(context.Context) error {
	m, r := b.m, b.Recipe
	agentDigest, agentSize, err := filedigest.Of(b.Agent.Path)
	if err != nil {
		return fmt.Errorf("agent binary: %w", err)
	}
	m.Agent = bundlefmt.File{Path: bundlefmt.AgentBinary, Size: agentSize, Digest: agentDigest}
	m.AgentOnStick = len(b.priors) == 0
	for _, rel := range b.priors {
		m.AgentOnStick = m.AgentOnStick || rel.agent != agentDigest
	}
	for _, k := range b.trust {
		tk, err := bundlefmt.TrustedKey(k)
		if err != nil {
			return err
		}
		m.Trust = append(m.Trust, tk)
	}
	if m.Space.CopyBytes == 0 && len(r.Release.Files) == 0 && !b.osChanges() {
		var from []string
		for _, rel := range b.priors {
			from = append(from, rel.release.Version)
		}
		return fmt.Errorf("the bundle would be empty: %s %s has no blob or OS change that %s lacks and no release files; nothing to upgrade", r.Name, r.Version, strings.Join(from, ", "))
	}
	return nil
}

// checkPrior refuses a --from the new release cannot follow.
func checkPrior(r *recipes.Recipe, b *priorRelease) error {
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
func checkSigner(priv ed25519.PrivateKey, trust []ed25519.PublicKey, priors []*priorRelease) (string, error) {
	pub := priv.Public().(ed25519.PublicKey)
	id, err := bundlefmt.KeyID(pub)
	if err != nil {
		return "", err
	}
	known := false
	for _, b := range priors {
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
	k, err := bundlefmt.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", p, err)
	}
	return k, nil
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

// writeBundle writes header and filesystem (and, for an image, the GPT) into
// the temporary output. kiln lays the squashfs out itself (sqfswrite), so
// its size and every file's offset are known before a byte is written: the
// header is sized from the manifest with only the metadata digest a
// placeholder of the same length, and the filesystem is written once, in
// place, each file's contents copied by the kernel.
func (b *bundler) writeBundle(ctx context.Context) error {
	m, priv := b.m, b.priv
	plan, err := sqfswrite.Scan(b.tree, sqfswrite.WithModTime(b.Epoch))
	if err != nil {
		return fmt.Errorf("bundle filesystem: %w", err)
	}
	if err := placeFiles(m, plan.Files()); err != nil {
		return err
	}
	if b.out, err = output.Create(b.o.Output); err != nil {
		return err
	}
	out := b.out.File
	m.Filesystem = bundlefmt.Filesystem{Size: plan.Size(), Metadata: digest.NewDigestFromEncoded(digest.SHA256, strings.Repeat("0", 64)).String()}
	placeholder, err := bundlefmt.Sign(m, priv)
	if err != nil {
		return err
	}
	hdrSize := bundlefmt.HeaderSize(len(placeholder))
	start := int64(0)
	if b.o.Format == FormatImage {
		start = gpt.StickStart
	}
	task := b.o.Progress.Task("write bundle filesystem", plan.DataBytes())
	err = plan.Write(ctx, out, start+hdrSize, task)
	task.Done(err)
	if err != nil {
		return err
	}
	// The files' contents are pinned by the digests the manifest has
	// already (the blobs are named by theirs): only the bytes around them
	// are read back and hashed, a few MiB of squashfs tables.
	task = b.o.Progress.Task("hash bundle filesystem metadata", 0)
	m.Filesystem.Metadata, err = m.HashMetadata(out, start+hdrSize, task)
	task.Done(err)
	if err != nil {
		return err
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("kiln bug: %w", err)
	}
	if m.OS != nil {
		if _, _, err := m.CheckOS(out, start+hdrSize); err != nil {
			return fmt.Errorf("kiln bug: %w", err)
		}
	}
	env, err := bundlefmt.Sign(m, priv)
	if err != nil {
		return err
	}
	hdr, err := bundlefmt.EncodeHeader(env, hdrSize)
	if err != nil {
		return fmt.Errorf("kiln bug: %w", err)
	}
	if _, err := out.WriteAt(hdr, start); err != nil {
		return fmt.Errorf("write bundle header: %w", err)
	}
	content := hdrSize + plan.Size()
	if b.o.Format == FormatFile {
		b.size = content
		return nil
	}
	if err := gpt.WriteStick(out, content, bundlefmt.PartitionType, bundlefmt.PartitionName, guidSeed(env)); err != nil {
		return err
	}
	b.size = gpt.StickSize(content)
	return nil
}

// commit makes the finished bundle the output (output.File.Commit).
func (b *bundler) commit(ctx context.Context) error { return b.out.Commit(ctx) }

// placeFiles sets each manifest file's offset from the filesystem's layout;
// the two lists must name the same files with the same sizes.
func placeFiles(m *bundlefmt.Manifest, files []sqfswrite.File) error {
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
