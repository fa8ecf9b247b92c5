// Package bundleimport takes a field upgrade bundle (a stick's partition
// device or a bundle file) onto the node: it checks the bundle is genuine
// and meant for this node before using anything from it, then stages its
// release through the release state machine, copying the release's blobs
// into the release store. Every refusal changes nothing. See docs/upgrade.md.
package bundleimport

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.podman.io/storage"
	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/freespace"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/localimage"
	"github.com/kiln-appliance/kiln/systemd/agent/osinstall"
	"github.com/kiln-appliance/kiln/systemd/agent/release"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// ErrNoTrust means the node has no key to check a bundle with.
var ErrNoTrust = errors.New("this node trusts no bundle key")

// Option configures Import.
type Option func(*importer)

type importer struct {
	root    string
	log     io.Writer
	machine *release.Machine
	copying func(digest string)
	osStep  func(step string)
	osJobs  int
	images  func() (storage.Store, error)
	retry   bool
}

// WithRoot prefixes every node path (trust, image partition, /var) with dir,
// as release.WithRoot does for the machine.
func WithRoot(dir string) Option { return func(i *importer) { i.root = dir } }

// WithLog sets where progress and the final word go (default stdout: the
// console under the import unit).
func WithLog(w io.Writer) Option { return func(i *importer) { i.log = w } }

// WithMachine sets the release state machine the release is staged with
// (default release.New with the same root).
func WithMachine(m *release.Machine) Option { return func(i *importer) { i.machine = m } }

// WithImageStore sets how the node's containers/storage is opened, for the
// release's preloaded images (default: none are loaded; CRI-O pulls them
// through the temporary registry at the upgrade boot).
func WithImageStore(open func() (storage.Store, error)) Option {
	return func(i *importer) { i.images = open }
}

// WithRetryFailed stages a release that failed on this node before (rolled
// back since a release was last confirmed), which Import otherwise refuses:
// a technician's deliberate retry, never the stick's automatic import.
func WithRetryFailed() Option { return func(i *importer) { i.retry = true } }

// WithOSStepHook calls f before each step of the OS install (osinstall):
// the crash tests kill the import there.
func WithOSStepHook(f func(step string)) Option { return func(i *importer) { i.osStep = f } }

// WithOSJobs sets how many chunks of an OS slot are written at once
// (osinstall.WithJobs).
func WithOSJobs(n int) Option { return func(i *importer) { i.osJobs = n } }

// WithCopyHook calls f with each blob's digest before it is copied: the
// fault tests pull the stick there.
func WithCopyHook(f func(digest string)) Option { return func(i *importer) { i.copying = f } }

// Import checks the bundle at source and stages its release. In order:
// signature against the node's trusted keys (nothing else is read before),
// recipe, arch, version, delta base, nothing else staged, free space on
// /var, every byte of the bundle's filesystem against the signed manifest;
// only then are blobs copied (each verified as it is written, those already
// stored kept) and the release recorded as staged, last.
func Import(ctx context.Context, source string, opts ...Option) (*state.State, error) {
	i := &importer{root: "/", log: os.Stdout, copying: func(string) {}, osStep: func(string) {}}
	for _, o := range opts {
		o(i)
	}
	if i.machine == nil {
		i.machine = release.New(release.WithRoot(i.root), release.WithLog(i.log))
	}
	f, err := inputfile.Open(source) // a FIFO is refused, not waited on
	if err != nil {
		return nil, fmt.Errorf("bundle: %w; give the upgrade stick's bundle partition (e.g. /dev/sdb1) or a bundle file", err)
	}
	defer f.Close()

	keys, ids, err := trustedKeys(i.path(contract.TrustDir))
	if err != nil {
		return nil, err
	}
	m, h, keyID, err := bundlefmt.Open(f, keys)
	if errors.Is(err, bundlefmt.ErrUntrusted) {
		err = fmt.Errorf("%w; this node trusts %s (%s): use a bundle signed by one of them", err, ids, contract.TrustDir)
	}
	if err != nil {
		return nil, refused(source, err)
	}
	fmt.Fprintf(i.log, "bundle %s %s (%s, %s) signed by %s\n", m.Recipe, m.Version, m.Kind, m.Arch, keyID)

	self, err := i.node()
	if err != nil {
		return nil, err
	}
	switch err := m.CheckNode(self.node); {
	case errors.Is(err, bundlefmt.ErrAlreadyStaged):
		fmt.Fprintf(i.log, "%v; nothing was changed\n", err)
		// A run cut before the staged release's boot entry was written:
		// the state machine writes it.
		s, err := i.machine.Converge(ctx)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(i.log, "release %s is staged; the stick may be removed now\n", m.Version)
		return s, nil
	case err != nil:
		return nil, refused(source, err)
	}
	if err := i.checkFailedBefore(source, m.Version, self); err != nil {
		return nil, err
	}
	free, err := freespace.Available(i.path("/var"))
	if err != nil {
		return nil, err
	}
	if err := m.CheckSpace(free); err != nil {
		return nil, refused(source, err)
	}

	var osPlan *osinstall.Plan
	if m.OS != nil {
		if osPlan, err = osinstall.Prepare(self.osNode(i.root), m, f, h.Size); err != nil {
			return nil, refused(source, err)
		}
		defer osPlan.Close()
	}

	incoming := filepath.Join(i.path(contract.ReleaseStore), incomingDir)
	r := m.Release(i.onPartition)
	if osPlan != nil && !osPlan.Unchanged {
		r.OS = &osPlan.OS
	}
	if osPlan != nil && m.Agent.Digest != self.partitionAgent() && !slices.Contains(r.Blobs, m.Agent.Digest) {
		// The release's own agent, which its entry hands off to (handoff).
		r.Blobs = append(r.Blobs, m.Agent.Digest)
		slices.Sort(r.Blobs)
	}
	wants, total, err := i.wants(m, r, incoming)
	if err != nil {
		return nil, refused(source, err)
	}
	undo, err := mkdirs(incoming)
	if err != nil {
		return nil, err
	}
	task := progress.New(i.log, false, progress.Every(2*time.Second)).
		Task(fmt.Sprintf("copy %d blob(s) for %d image(s)", len(wants), len(m.Images)), total)
	err = i.receive(ctx, bundleFS{f, h.Size}, inbox{incoming, r.Blobs}, wants, task)
	task.Done(err)
	if err != nil {
		// A part that does not hash as signed proves the bundle wrong (not
		// a stick that went away): refused, nothing kept.
		if errors.Is(err, bundlefmt.ErrDamaged) {
			undo()
			return nil, refused(source, err)
		}
		return nil, fmt.Errorf("import from %s: %w; nothing was staged, plug the stick in again to retry", source, err)
	}

	// A node that has not recorded its state yet (it is recorded at boot)
	// records the factory release now; this changes nothing it runs.
	if _, err := i.machine.Load(); errors.Is(err, os.ErrNotExist) {
		if _, err := i.machine.Init(ctx, self.factory); err != nil {
			return nil, err
		}
	}
	var retry []release.ImportOption
	if i.retry {
		retry = append(retry, release.RetryFailed())
	}
	s, err := i.machine.Import(ctx, r, func(ctx context.Context, blobDir string) error {
		if err := i.fill(ctx, r, incoming, blobDir); err != nil {
			return err
		}
		if osPlan == nil {
			return nil
		}
		return osPlan.Write(ctx, osinstall.WithLog(i.log), osinstall.WithStepHook(i.osStep), osinstall.WithJobs(i.osJobs))
	}, retry...)
	switch {
	case errors.Is(err, release.ErrFailedBefore): // recorded since the check above
		return nil, fmt.Errorf("bundle %s refused: %w; %s; nothing was staged", source, err, retryHint(m.Version, source))
	case errors.Is(err, contract.ErrDamaged):
		return nil, fmt.Errorf("bundle %s refused: %w; nothing was staged, the inactive slot has no boot entry and the node stays on release %s", source, err, self.current.Version)
	case err != nil:
		return nil, fmt.Errorf("import from %s: %w; nothing was staged, plug the stick in again to retry", source, err)
	}
	if self.failure(m.Version) != nil {
		// Run by hand (the stick's unit never retries): its reboot
		// policy does not follow.
		fmt.Fprintf(i.log, "release %s is staged again; the stick may be removed now; reboot the appliance (systemctl reboot) to try it once more\n", m.Version)
		return s, nil
	}
	fmt.Fprintf(i.log, "release %s is staged; the stick may be removed now\n", m.Version)
	return s, nil
}

// checkFailedBefore refuses a release that failed on this node before,
// saying when, why and how to retry it, unless the technician asked to
// retry: then it says loudly that it is retried. The stick's import runs
// by itself whenever it is plugged in, and at every boot while it stays
// in: taking a failed release again by default would try it again and
// again, each time with the reboots and rollback it took before.
func (i *importer) checkFailedBefore(source, version string, self self) error {
	f := self.failure(version)
	switch {
	case f == nil:
		return nil
	case !i.retry:
		return refused(source, fmt.Errorf("%w; %s", release.FailedBefore(*f), retryHint(version, source)))
	}
	fmt.Fprintf(i.log, "kiln: RETRYING release %s, which failed on this node before, as asked (--retry-failed): %v\n", version, release.FailedBefore(*f))
	return nil
}

// retryHint is what a technician does about a release that failed before.
func retryHint(version, source string) string {
	return fmt.Sprintf("it will most likely fail the same way: send this line to the factory and ask for a fixed release; "+
		"to try %s once more anyway, run: %s agent import --retry-failed %s", version, contract.AgentPath, source)
}

// refused wraps a check's error as the console's one-line verdict.
func refused(source string, err error) error {
	if strings.Contains(err.Error(), "nothing was changed") {
		return fmt.Errorf("bundle %s refused: %w", source, err)
	}
	return fmt.Errorf("bundle %s refused: %w; nothing was changed", source, err)
}

func (i *importer) path(p string) string { return filepath.Join(i.root, p) }

// self is what the node knows of itself.
type self struct {
	node     bundlefmt.Node
	factory  contract.Release
	current  contract.Release
	contents *contract.Contents
	state    *state.State
}

// failure is how version failed on this node before, or nil.
func (s self) failure(version string) *state.Result { return s.state.Failure(version) }

// partitionAgent is the digest of the image partition's agent.
func (s self) partitionAgent() string {
	for _, f := range s.contents.Files {
		if f.Path == contract.AgentBinary {
			return f.Digest
		}
	}
	return ""
}

// osNode is the node as the OS install sees it.
func (s self) osNode(root string) osinstall.Node {
	n := osinstall.Node{Root: root, ESP: bootloader.ESP, Slots: s.contents.OSSlots, Base: s.node.Current, PartitionAgent: s.partitionAgent(), SecureBoot: s.contents.SecureBoot}
	if s.current.OS != nil {
		n.Entry = s.current.OS.Entry
	}
	return n
}

// node is what the node knows of itself: recipe, arch and OS slots from the
// image partition, current and staged release from the state (the factory
// release when none is recorded yet).
func (i *importer) node() (self, error) {
	c, err := contract.Read(i.path(contract.MountPoint))
	if err != nil {
		return self{}, fmt.Errorf("read the image partition (is %s mounted?): %w", contract.MountPoint, err)
	}
	factory := release.FactoryRelease(c)
	st, err := i.machine.Load()
	switch {
	case errors.Is(err, os.ErrNotExist):
		st = &state.State{Current: factory}
	case err != nil:
		return self{}, err
	}
	n := bundlefmt.Node{Recipe: c.Recipe, Arch: c.Arch, Current: st.Current.ID()}
	if n.Current.LockDigest == "" && st.Current.Version == c.Version {
		n.Current.LockDigest = c.LockDigest // recorded before releases kept their lock digest
	}
	if r := st.Staged; r != nil {
		id := r.ID()
		n.Staged = &id
	}
	if r := st.Trying; r != nil {
		id := r.ID()
		n.Trying = &id
	}
	current := st.Current
	if current.OS == nil && current.Version == factory.Version {
		current.OS = factory.OS
	}
	return self{node: n, factory: factory, current: current, contents: c, state: st}, nil
}

// onPartition: the image partition holds blob d.
func (i *importer) onPartition(d string) bool {
	alg, hx, _ := strings.Cut(d, ":")
	_, err := os.Stat(filepath.Join(i.path(contract.MountPoint), contract.OCIDir, "blobs", alg, hx))
	return err == nil
}

// wants lists the parts of the bundle's filesystem the import copies: the
// blobs release r keeps in the store that neither the store nor incoming
// holds yet (stored for another release, or left by a pulled stick), by
// offset, and their bytes.
func (i *importer) wants(m *bundlefmt.Manifest, r contract.Release, incoming string) ([]part, int64, error) {
	files := map[string]bundlefmt.File{}
	for _, f := range m.Files {
		files[f.Path] = f
	}
	sources := map[string]string{}
	for _, b := range m.Blobs {
		if b.OnStick {
			_, hx, _ := strings.Cut(b.Digest, ":")
			sources[b.Digest] = path.Join(bundlefmt.OCIDir, "blobs", "sha256", hx)
		}
	}
	for _, f := range m.ReleaseFiles {
		sources[f.Digest] = path.Join(bundlefmt.ReleaseDir, f.Path)
	}
	if m.AgentOnStick {
		sources[m.Agent.Digest] = bundlefmt.AgentBinary
	}
	blobDir := filepath.Join(i.path(contract.ReleaseStore), "blobs", "sha256")
	var wants []part
	var total int64
	for _, d := range r.Blobs {
		_, hx, _ := strings.Cut(d, ":")
		if exists(filepath.Join(blobDir, hx)) || exists(filepath.Join(incoming, hx)) {
			continue
		}
		src, ok := sources[d]
		if !ok {
			return nil, 0, fmt.Errorf("blob %s is neither in the bundle, on the image partition nor in the release store; use a full bundle", d)
		}
		f, ok := files[src]
		if !ok || f.Digest != d {
			return nil, 0, fmt.Errorf("%w: the manifest lists no file %s holding %s", bundlefmt.ErrDamaged, src, d)
		}
		wants = append(wants, part{digest: d, offset: f.Offset, size: f.Size})
		total += f.Size
	}
	slices.SortFunc(wants, func(a, b part) int { return cmp.Compare(a.offset, b.offset) })
	return wants, total, nil
}

// fill moves into blobDir every blob release r keeps in the store that is
// not there yet, from incoming (each already verified and durable), then
// loads the release's preloaded images. It runs under the state lock.
func (i *importer) fill(ctx context.Context, r contract.Release, incoming, blobDir string) error {
	if err := os.MkdirAll(blobDir, 0o755); err != nil {
		return err
	}
	moved := false
	for _, d := range r.Blobs {
		_, hx, _ := strings.Cut(d, ":")
		if exists(filepath.Join(blobDir, hx)) {
			continue
		}
		if err := os.Rename(filepath.Join(incoming, hx), filepath.Join(blobDir, hx)); err != nil {
			return fmt.Errorf("release store: blob %s: %w", d, err)
		}
		moved = true
	}
	if moved {
		for _, dir := range []string{blobDir, incoming} {
			if err := atomicfile.SyncDir(dir); err != nil {
				return err
			}
		}
	}
	if i.images == nil {
		return nil
	}
	store, err := i.images()
	if err != nil {
		return fmt.Errorf("open containers/storage: %w", err)
	}
	defer store.Shutdown(false) //nolint:errcheck // nothing mounted
	return loadImages(ctx, store, r.Images, localimage.BlobDirs{filepath.Dir(blobDir), filepath.Join(i.path(contract.MountPoint), contract.OCIDir, "blobs")}, i.log)
}

// loadImages puts every preloaded image of the release into store (see
// localimage.Load); images already there are kept, so a re-run only adds
// what is missing.
func loadImages(ctx context.Context, store storage.Store, images []contract.Image, blobs localimage.BlobDirs, log io.Writer) error {
	var todo []contract.Image
	for _, im := range images {
		if !im.Preloaded {
			continue
		}
		ids, err := localimage.Find(store, im)
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			todo = append(todo, im)
		}
	}
	for n, im := range todo {
		if err := ctx.Err(); err != nil {
			return err
		}
		fmt.Fprintf(log, "  loading image %d of %d: %s\n", n+1, len(todo), im.Name)
		if err := localimage.Load(store, im, blobs); err != nil {
			return fmt.Errorf("load %s into containers/storage: %w", im.Name, err)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	// Durable before the import goes on: containers/storage does not sync
	// what it unpacks, and a power cut during the minutes of an OS slot
	// write after this (seen in QEMU: a reset 5 s after the load) left a
	// layer that the next import could not unpack again.
	if err := syncFS(store.GraphRoot()); err != nil {
		return fmt.Errorf("containers/storage: %w", err)
	}
	return nil
}

// syncFS writes back everything cached of the filesystem holding dir.
func syncFS(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// mkdirs creates dir and its missing parents; undo removes what it created.
func mkdirs(dir string) (undo func(), err error) {
	top := ""
	for d := dir; !exists(d); d = filepath.Dir(d) {
		top = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("release store: %w", err)
	}
	return func() {
		if top != "" {
			os.RemoveAll(top)
		}
	}, nil
}

// trustedKeys reads the keys the node accepts bundles from (dir is
// contract.TrustDir under the node's root): at least one, or nothing can be
// imported.
func trustedKeys(dir string) (keys []ed25519.PublicKey, ids string, err error) {
	trusted, err := bundlefmt.ReadTrustDir(dir)
	if err != nil {
		return nil, "", err
	}
	if len(trusted) == 0 {
		return nil, "", fmt.Errorf("%w: %s holds no key (the factory build writes it from the recipe's trust); no bundle can be imported", ErrNoTrust, dir)
	}
	var names []string
	for _, k := range trusted {
		pub, err := bundlefmt.ParsePublicKey([]byte(k.PublicKey))
		if err != nil {
			return nil, "", fmt.Errorf("trusted key %s: %w", k.KeyID, err)
		}
		keys = append(keys, pub)
		names = append(names, k.KeyID)
	}
	return keys, strings.Join(names, ", "), nil
}
