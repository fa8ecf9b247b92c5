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
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/progress"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// DefaultSourceDateEpoch is the timestamp of every file kiln writes when
// SOURCE_DATE_EPOCH is not set: 1980-01-01, the oldest date FAT can hold.
const DefaultSourceDateEpoch = 315532800

// Options configure a build.
type Options struct {
	Output      string // the disk image to write
	CacheDir    string // blob cache; fetch.DefaultDir() when empty
	RefreshLock bool   // re-resolve tags and rewrite the lock
	// Agent is the kiln binary to place on the image partition for the node
	// to run. Empty means this very executable, which works only when the
	// recipe's arch is the host's.
	Agent           string
	SourceDateEpoch int64 // 0: $SOURCE_DATE_EPOCH, else DefaultSourceDateEpoch
	Progress        progress.Reporter
	Log             io.Writer // human-readable steps; io.Discard when nil
	Fetch           []fetch.Option
}

// Result describes what a build wrote.
type Result struct {
	Output   string
	Layout   *partitions.Layout
	Contents *contract.Contents
}

// Build runs the whole pipeline for the recipe at recipePath. On any error,
// including cancellation, it leaves no output behind and an existing output
// file untouched: the disk is written to a temporary file beside the output
// and renamed over it only once complete.
func Build(ctx context.Context, recipePath string, o Options) (res *Result, err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Progress == nil {
		o.Progress = progress.Discard()
	}
	epoch, err := sourceDateEpoch(o.SourceDateEpoch)
	if err != nil {
		return nil, err
	}
	r, err := recipes.Load(recipePath)
	if err != nil {
		return nil, err
	}
	if err := r.CheckFiles(); err != nil {
		return nil, err
	}
	agent, err := agentBinary(o.Agent, r.Arch)
	if err != nil {
		return nil, err
	}

	// Fail on an unwritable output directory now, not after an hour of fetching.
	out, err := createTemp(o.Output)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()

	lock, err := EnsureLock(ctx, r, LockOptions{Refresh: o.RefreshLock, Fetch: o.Fetch}, o.Log)
	if err != nil {
		return nil, err
	}
	lockBytes, err := lock.Encode()
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
	images, err := fetchAll(ctx, cache, r, lock, o)
	if err != nil {
		return nil, err
	}

	// The staging tree lives in the cache directory so blobs can be hard
	// links to the cache rather than copies.
	work, err := os.MkdirTemp(cacheDir, "build-")
	if err != nil {
		return nil, fmt.Errorf("staging directory: %w", err)
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "partition")
	contents, err := stagePartition(ctx, root, work, cache, r, images, agent, epoch, o)
	if err != nil {
		return nil, err
	}
	contents.LockDigest = digestOf(lockBytes)
	contents.Created = epoch
	if err := stage.WriteContents(root, contents); err != nil {
		return nil, err
	}

	seed := buildSeed(r, lockBytes, root)
	layout, err := assemble(ctx, out, r, contents, root, seed, epoch, o)
	if err != nil {
		return nil, err
	}
	if err := out.Sync(); err != nil {
		return nil, fmt.Errorf("write %s: %w", o.Output, err)
	}
	if err := out.Close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", o.Output, err)
	}
	if err := os.Rename(out.Name(), o.Output); err != nil {
		return nil, fmt.Errorf("write %s: %w", o.Output, err)
	}
	syncDir(filepath.Dir(o.Output))
	return &Result{Output: o.Output, Layout: layout, Contents: contents}, nil
}

// fetchedImage is a locked image whose blobs are all in the cache.
type fetchedImage struct {
	recipe recipes.Image
	locked recipes.LockedImage
	image  *fetch.Image
}

func fetchAll(ctx context.Context, cache *fetch.Cache, r *recipes.Recipe, lock *recipes.Lock, o Options) ([]fetchedImage, error) {
	var reqs []fetch.Request
	var locked []recipes.LockedImage
	for _, img := range r.Images {
		li, ok := lock.Image(img.Name)
		if !ok { // lock.Check already refused this; keep the error precise anyway
			return nil, fmt.Errorf("image %s is not in the lock file: run `kiln lock %s`", img.Name, r.Path)
		}
		locked = append(locked, li)
		reqs = append(reqs, fetch.Request{Name: img.Name, Source: li.Source, BaseDir: r.Dir, Digest: li.Digest, Platform: platform(r)})
	}
	fetched, err := cache.FetchAll(ctx, reqs, o.Progress, o.Fetch...)
	if err != nil {
		return nil, err
	}
	out := make([]fetchedImage, len(fetched))
	for i, fi := range fetched {
		out[i] = fetchedImage{recipe: r.Images[i], locked: locked[i], image: fi}
	}
	return out, nil
}

// stagePartition lays out the image partition's tree under root.
func stagePartition(ctx context.Context, root, work string, cache *fetch.Cache, r *recipes.Recipe, images []fetchedImage, agent string, epoch int64, o Options) (*contract.Contents, error) {
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		return nil, err
	}
	var served, preloaded []stage.Image
	contents := &contract.Contents{
		SchemaVersion: contract.ContentsVersion,
		Recipe:        r.Name,
		Version:       r.Version,
		Arch:          r.Arch,
	}
	hosts := map[string]bool{}
	for _, fi := range images {
		si := stageImage(fi)
		if fi.recipe.Served() {
			served = append(served, si)
			host, err := upstreamHost(fi.recipe.Name)
			if err != nil {
				return nil, err
			}
			hosts[host] = true
		}
		if fi.recipe.Preloaded() {
			preloaded = append(preloaded, si)
		}
		contents.Images = append(contents.Images, contract.Image{
			Name:      fi.recipe.Name,
			Digest:    fi.locked.Digest,
			MediaType: fi.locked.MediaType,
			Size:      fi.locked.Size,
			Served:    fi.recipe.Served(),
			Preloaded: fi.recipe.Preloaded(),
			ImageID:   fi.image.Config.Digest.String(),
		})
	}
	task := o.Progress.Task("stage image partition", 0)
	if err := stage.WriteLayout(filepath.Join(root, contract.OCIDir), blobPath(cache), served); err != nil {
		task.Done(err)
		return nil, err
	}
	if len(preloaded) > 0 {
		if err := preloadImages(ctx, root, work, cache, preloaded, epoch, r.Arch, o); err != nil {
			task.Done(err)
			return nil, err
		}
	}
	if err := stage.CopyFile(agent, filepath.Join(root, contract.AgentBinary), 0o755); err != nil {
		task.Done(err)
		return nil, fmt.Errorf("copy agent binary %s: %w", agent, err)
	}
	files, err := stage.ListFiles(root)
	task.Done(err)
	if err != nil {
		return nil, err
	}
	contents.Files = files
	for h := range hosts {
		contents.Registry.Upstreams = append(contents.Registry.Upstreams, h)
	}
	sort.Strings(contents.Registry.Upstreams)
	contents.Registry.Listen = r.Registry.Listen
	contents.Registry.AlwaysOn = r.Registry.AlwaysOn
	contents.Registry.MirrorTags = r.Registry.MirrorsTags()
	if len(preloaded) > 0 {
		contents.Registry.PreloadMode = r.Preload.Mode
	}
	return contents, nil
}

func stageImage(fi fetchedImage) stage.Image {
	blobs := []v1.Hash{fi.image.Config.Digest}
	for _, l := range fi.image.Layers {
		blobs = append(blobs, l.Digest)
	}
	return stage.Image{Ref: fi.recipe.Name, Manifest: fi.image.Descriptor, Blobs: blobs}
}

func blobPath(c *fetch.Cache) stage.BlobSource { return c.Path }

// buildSeed derives the disk's GUIDs from the build's inputs, so the same
// recipe, lock and content give the same disk, and different ones differ.
func buildSeed(r *recipes.Recipe, lockBytes []byte, root string) []byte {
	h := sha256.New()
	recipeBytes, _ := os.ReadFile(r.Path)
	contents, _ := os.ReadFile(filepath.Join(root, contract.ContentsFile))
	for _, b := range [][]byte{recipeBytes, lockBytes, contents} {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return h.Sum(nil)
}

func digestOf(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }

// sourceDateEpoch picks the build's timestamp: the option, then
// $SOURCE_DATE_EPOCH, then DefaultSourceDateEpoch.
func sourceDateEpoch(v int64) (int64, error) {
	if v != 0 {
		return v, nil
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		var n int64
		if _, err := fmt.Sscan(s, &n); err != nil || n < 0 {
			return 0, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a non-negative number of seconds", s)
		}
		return n, nil
	}
	return DefaultSourceDateEpoch, nil
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
		path = exe
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("agent binary %s: not a Linux executable: %w", path, err)
	}
	defer f.Close()
	if want := elfMachine[arch]; f.Machine != want {
		return "", fmt.Errorf("agent binary %s is for %s, the recipe needs %s", path, f.Machine, want)
	}
	return path, nil
}

// createTemp creates the temporary file the disk is written to, beside out.
func createTemp(out string) (*os.File, error) {
	if out == "" {
		return nil, fmt.Errorf("no output file given (-o DISK)")
	}
	dir := filepath.Dir(out)
	f, err := os.CreateTemp(dir, "."+filepath.Base(out)+".kiln-tmp-")
	if err != nil {
		return nil, fmt.Errorf("cannot write the output in %s: %w (choose a writable directory with -o)", dir, err)
	}
	return f, nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
