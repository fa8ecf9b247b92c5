package builder

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/output"
	"github.com/kiln-appliance/kiln/builder/preload"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions/base"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/osslots"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Options configure a build.
type Options struct {
	Output      string // the disk image to write
	CacheDir    string // blob cache; fetch.DefaultDir() when empty
	RefreshLock bool   // re-resolve tags and rewrite the lock
	// Agent is the node's kiln binary to place on the image partition
	// (`make build` writes it as out/kiln-agent: kiln built with the nodeonly
	// tag). Empty means kiln-agent beside this executable (refused when
	// there is none), which works only when the recipe's arch is the host's.
	Agent           string
	SourceDateEpoch int64 // 0: $SOURCE_DATE_EPOCH, else DefaultSourceDateEpoch
	Progress        progress.Reporter
	Log             io.Writer // human-readable steps; io.Discard when nil
	Fetch           []fetch.Option

	// SecureBootKey is the db private key (kiln key secureboot's db.key)
	// that signs a Secure Boot disk's boot files (the recipe's secureBoot);
	// given at build time, never named in the recipe.
	SecureBootKey string
}

// Result describes what a build wrote.
type Result struct {
	Output   string
	Layout   *gpt.Layout
	Contents *contract.Contents
	Agent    *Agent // the node's kiln the disk carries
}

// build is one run of the pipeline. Each step is a method that reads what
// the steps before it left on the struct and adds its own result, so the
// order of the pipeline is the order of the calls in Build.
type build struct {
	*Run // the recipe, the timestamp, the kiln binary that goes onto the image partition
	o    Options

	out       *output.File // the temporary disk file, renamed to o.Output at the end
	lock      *recipes.Lock
	lockBytes []byte
	cache     *fetch.Cache
	work      string // staging directory inside the cache directory
	root      string // the image partition's tree, under work

	osSlots  *contract.OSSlots // the base's A/B OS slots, nil when it has none
	images   []fetchedImage
	inPlace  map[v1.Hash]inPlaceBlob // blobs packed from their source, not the cache
	contents *contract.Contents
	ignition []byte
	layout   *gpt.Layout

	secureBoot *SecureBootESP // what a Secure Boot build signs, nil without
}

// Build runs the whole pipeline for the recipe at recipePath. On any error,
// including cancellation, it leaves no output behind and an existing output
// file untouched: the disk is written to a temporary file beside the output
// and renamed over it only once complete.
func Build(ctx context.Context, recipePath string, o Options) (*Result, error) {
	b, err := newBuild(ctx, recipePath, o)
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	if stop, err := startCPUProfile(); err != nil {
		return nil, err
	} else {
		defer stop()
	}
	steps := []func(context.Context) error{
		b.createOutput, // first: an unwritable output fails now, not after an hour of fetching
		b.sweepLeftovers,
		b.readOSSlots, // before any fetch: a base without a boot partition, or that cannot be upgraded slot by slot, fails now
		// Before any fetch too: a wrong key, a base without slots or systemd-boot.
		b.prepareSecureBoot,
		b.lockImages,
		b.fetchImages,
		b.stagePartition,
		b.renderIgnition,
		b.assembleDisk,
		b.commit,
		b.rememberInPlace,
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return &Result{Output: o.Output, Layout: b.layout, Contents: b.contents, Agent: b.Agent}, nil
}

// startCPUProfile writes a Go CPU profile of the build to
// $KILN_CPUPROFILE when set (hidden: for measuring where a build's time
// goes, docs/BENCHMARKS.md).
func startCPUProfile() (stop func(), err error) {
	path := os.Getenv("KILN_CPUPROFILE")
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("KILN_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("KILN_CPUPROFILE: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// newBuild reads and checks everything that needs no long work (StartRun)
// and the fixed sizes.
func newBuild(ctx context.Context, recipePath string, o Options) (*build, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Progress == nil {
		o.Progress = progress.Discard()
	}
	if o.CacheDir == "" {
		o.CacheDir = fetch.DefaultDir()
	}
	run, err := StartRun(ctx, recipePath, RunOptions{Agent: o.Agent, SourceDateEpoch: o.SourceDateEpoch})
	if err != nil {
		return nil, err
	}
	b := &build{Run: run, o: o}
	if err := b.checkSizes(nil); err != nil {
		return nil, err
	}
	return b, nil
}

// createOutput creates the temporary file the disk is written to, beside
// the output.
func (b *build) createOutput(context.Context) error {
	if err := output.Check(b.o.Output, "appliance.raw", b.Inputs("the agent binary that goes on the disk")); err != nil {
		return err
	}
	f, err := output.Create(b.o.Output)
	b.out = f
	return err
}

// workDirPrefix names a build's staging tree in the cache directory; its
// name carries the build's tag, so a later build can tell a killed build's
// leftovers apart.
const workDirPrefix = "build-"

// sweepLeftovers removes what builds killed before their cleanup ran
// (SIGKILL, a power cut) left behind: a temporary disk beside this output,
// staging trees in the cache directory, preload run roots in $TMPDIR. Only
// entries whose owner is provably dead go; a failure to remove one is
// reported and does not stop the build.
func (b *build) sweepLeftovers(context.Context) error {
	output.Sweep(b.o.Output, "build", b.o.Log,
		output.Work{Dir: b.o.CacheDir, Prefix: workDirPrefix},
		output.Work{Dir: os.TempDir(), Prefix: preload.RunRootPrefix})
	return nil
}

// lockImages reads the lock, or resolves and writes one (EnsureLock).
func (b *build) lockImages(ctx context.Context) error {
	lock, err := EnsureLock(ctx, b.Recipe, LockOptions{Refresh: b.o.RefreshLock, Fetch: b.o.Fetch, Check: b.checkSizes}, b.o.Log)
	if err != nil {
		return err
	}
	b.lockBytes, err = lock.Encode()
	b.lock = lock
	return err
}

// readOSSlots finds the base's A/B OS slots (osslots.Read): kiln.json
// records them for the node.
func (b *build) readOSSlots(context.Context) error {
	r := b.Recipe
	path := r.Resolve(r.Base.Path)
	d, err := base.OpenDisk(path, "")
	if err != nil {
		return err
	}
	defer d.Close()
	// The partition the Ignition config goes into, checked now: a base
	// without one would otherwise fail only once the images are fetched.
	if _, err := bootconfig.Find(d.Layout); err != nil {
		return r.Errorf("base.path", "base image %s: %v", path, err)
	}
	s, err := osslots.Read(d)
	if err != nil {
		return r.Errorf("base.path", "base image %s: %v", path, err)
	}
	if err := osslots.CheckArch(s, r.Arch); err != nil {
		return r.Errorf("base.path", "base image %s: %v", path, err)
	}
	if s != nil {
		// The disk keeps the base's ESP as it is: what the factory wrote
		// there, `kiln verify --booted` holds it to.
		if s.Boot, err = osslots.RecordBoot(d); err != nil {
			return r.Errorf("base.path", "base image %s: %v", path, err)
		}
	}
	b.osSlots = s
	return nil
}

// commit makes the finished disk the output (output.File.Commit). After
// it, cleanup has nothing of the output left to remove.
func (b *build) commit(ctx context.Context) error { return b.out.Commit(ctx) }

// cleanup removes the staging tree and, unless commit ran, the temporary
// disk file.
func (b *build) cleanup() {
	if b.work != "" {
		os.RemoveAll(b.work)
	}
	b.secureBoot.Remove()
	b.out.Discard()
}

// seed derives the disk's GUIDs from the build's inputs, so the same recipe,
// lock and content give the same disk, and different ones differ.
func (b *build) seed() []byte {
	h := sha256.New()
	recipeBytes, _ := os.ReadFile(b.Recipe.Path)
	contents, _ := os.ReadFile(filepath.Join(b.root, contract.ContentsFile))
	for _, data := range [][]byte{recipeBytes, b.lockBytes, contents} {
		fmt.Fprintf(h, "%d:", len(data))
		h.Write(data)
	}
	return h.Sum(nil)
}

// NodeBinaryName is the node's edition of kiln (built with -tags nodeonly:
// serve and agent only), looked for beside the kiln executable.
const NodeBinaryName = "kiln-agent"

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// agentBinary finds the kiln binary the node will run and checks it is a
// Linux executable for the recipe's arch.
func agentBinary(path, arch string) (string, error) {
	if path == "" {
		if arch != runtime.GOARCH {
			return "", fmt.Errorf("the recipe is for %s but this kiln is %s: pass the %s kiln binary with --agent (e.g. GOARCH=%s make build)", arch, runtime.GOARCH, arch, arch)
		}
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find this kiln binary for the node: %w; pass --agent", err)
		}
		// The node's edition links none of the factory's libraries: a quarter
		// of the size, and the registry starts without their package inits.
		// Without it, refuse rather than put this factory binary on the
		// node unasked (a delta bundle grew 20 times).
		path = filepath.Join(filepath.Dir(exe), NodeBinaryName)
		if !fileExists(path) {
			size := "?"
			if fi, err := os.Stat(exe); err == nil {
				size = human.Bytes(fi.Size())
			}
			return "", fmt.Errorf("no %s beside %s: the node runs kiln's node edition, %s, which `make build` writes beside kiln: put it there, or name it with --agent FILE (--agent %s would put this factory binary, %s, on the node instead, four times the size)",
				NodeBinaryName, exe, NodeBinaryName, exe, size)
		}
	}
	file, err := inputfile.OpenFile(path)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	defer file.Close()
	f, err := elf.NewFile(file)
	if err != nil {
		return "", fmt.Errorf("agent binary %s: not a Linux executable: %w", path, err)
	}
	if want := elfMachine[arch]; f.Machine != want {
		return "", fmt.Errorf("agent binary %s is for %s, the recipe needs %s", path, f.Machine, want)
	}
	return path, nil
}
