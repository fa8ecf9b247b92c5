package builder

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/output"
	"github.com/kiln-appliance/kiln/builder/preload"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// fetchedImage is a locked image whose blobs are all in the cache.
type fetchedImage struct {
	recipe recipes.Image
	image  *fetch.Image
}

// fetchImages brings every locked image's blobs into the cache, verified.
func (b *build) fetchImages(ctx context.Context) error {
	cache, err := fetch.Open(b.o.CacheDir)
	if err != nil {
		return err
	}
	b.cache = cache
	locked, err := LockedImages(b.Recipe, b.lock)
	if err != nil {
		return err
	}
	reqs := make([]fetch.Request, len(locked))
	for i, img := range b.Recipe.Images {
		reqs[i] = FetchRequest(b.Recipe, locked[i])
		// A served image's blobs go onto the partition as they are, so a
		// local layout's may be packed from where they lie and checked
		// there (checkInPlace); preloading reads them from the cache.
		reqs[i].InPlace = img.Served() && !img.Preloaded()
	}
	fetched, err := cache.FetchAll(ctx, reqs, b.o.Progress, b.o.Fetch...)
	if err != nil {
		return LockError(b.lock, err)
	}
	b.images = make([]fetchedImage, len(fetched))
	for i, fi := range fetched {
		if err := checkLockedSize(b.lock, locked[i], fi); err != nil {
			return err
		}
		b.images[i] = fetchedImage{recipe: b.Recipe.Images[i], image: fi}
	}
	b.collectInPlace()
	return nil
}

// stagePartition lays out the image partition's tree: the OCI layout of the
// served images, the preloaded store, the agent, and kiln.json last.
func (b *build) stagePartition(ctx context.Context) error {
	// The staging tree lives in the cache directory so blobs can be hard
	// links to the cache rather than copies.
	work, err := output.MkdirWork(output.Work{Dir: b.o.CacheDir, Prefix: workDirPrefix})
	if err != nil {
		return fmt.Errorf("staging directory: %w", err)
	}
	b.work, b.root = work, filepath.Join(work, "partition")
	if err := os.MkdirAll(filepath.Join(b.root, "bin"), 0o755); err != nil {
		return err
	}
	c, err := b.describe()
	if err != nil {
		return err
	}
	served, preloaded := b.split()
	task := b.o.Progress.Task("stage image partition", 0)
	err = b.writeTree(ctx, c, served, preloaded)
	task.Done(err)
	if err != nil {
		return err
	}
	if err := stage.WriteContents(b.root, c); err != nil {
		return err
	}
	b.contents = c
	return nil
}

// describe is kiln.json but for the list of files, which writeTree adds.
func (b *build) describe() (*contract.Contents, error) {
	r := b.Recipe
	c := &contract.Contents{
		SchemaVersion: contract.ContentsVersion,
		Recipe:        r.Name,
		Version:       r.Version,
		Arch:          r.Arch,
		LockDigest:    digest.FromBytes(b.lockBytes).String(),
		Created:       b.Epoch,
		Kiln:          version.Current(),
		Registry: contract.Registry{
			Listen:     r.Registry.Listen,
			AlwaysOn:   r.Registry.AlwaysOn,
			MirrorTags: r.Registry.MirrorsTags(),
		},
		OSSlots: b.osSlots,
	}
	if b.secureBoot != nil {
		c.SecureBoot = b.secureBoot.Record()
	}
	hosts := map[string]bool{}
	for _, fi := range b.images {
		if fi.recipe.Served() {
			ref, err := contract.ParseReference(fi.recipe.Name)
			if err != nil {
				return nil, err
			}
			hosts[ref.Host] = true
		}
		if fi.recipe.Preloaded() {
			c.Registry.PreloadMode = r.Preload.Mode
		}
		c.Images = append(c.Images, DescribeImage(fi.recipe, fi.image))
	}
	for h := range hosts {
		c.Registry.Upstreams = append(c.Registry.Upstreams, h)
	}
	sort.Strings(c.Registry.Upstreams)
	return c, nil
}

// DescribeImage is how kiln.json and a bundle's manifest describe a fetched
// image of the recipe (fetched by its locked digest, and checked against
// the lock's size, so it is the lock's).
func DescribeImage(ri recipes.Image, img *fetch.Image) contract.Image {
	size := img.Descriptor.Size
	for _, d := range img.Blobs() {
		size += d.Size
	}
	return contract.Image{
		Name:      ri.Name,
		Digest:    img.Descriptor.Digest.String(),
		MediaType: string(img.Descriptor.MediaType),
		Size:      size,
		Served:    ri.Served(),
		Preloaded: ri.Preloaded(),
		ImageID:   img.Config.Digest.String(),
	}
}

// split sorts the images into the served and the preloaded ones.
func (b *build) split() (served, preloaded []stage.Image) {
	for _, fi := range b.images {
		blobs := []v1.Hash{fi.image.Config.Digest}
		for _, l := range fi.image.Layers {
			blobs = append(blobs, l.Digest)
		}
		si := stage.Image{Ref: fi.recipe.Name, Manifest: fi.image.Descriptor, Blobs: blobs}
		if fi.recipe.Served() {
			served = append(served, si)
		}
		if fi.recipe.Preloaded() {
			preloaded = append(preloaded, si)
		}
	}
	return served, preloaded
}

// writeTree writes everything on the partition but kiln.json, and lists it
// in c.Files.
func (b *build) writeTree(ctx context.Context, c *contract.Contents, served, preloaded []stage.Image) error {
	if err := stage.WriteLayout(filepath.Join(b.root, contract.OCIDir), b.blobPath, served, stage.Borrowed(b.isInPlace)); err != nil {
		return err
	}
	if err := stage.WriteRegistryIndex(filepath.Join(b.root, contract.OCIDir)); err != nil {
		return err
	}
	if len(preloaded) > 0 {
		if err := b.preload(ctx, preloaded); err != nil {
			return err
		}
	}
	if err := stage.CopyFile(b.Agent.Path, filepath.Join(b.root, contract.AgentBinary), 0o755); err != nil {
		return fmt.Errorf("copy agent binary %s: %w", b.Agent.Path, err)
	}
	files, err := stage.ListFiles(b.root)
	c.Files = files
	return err
}

// preload writes the preloaded images into a containers/storage store on
// the partition. They are read from a throwaway OCI layout in the work
// directory (not the partition's own, which holds only the served images).
func (b *build) preload(ctx context.Context, images []stage.Image) error {
	src := filepath.Join(b.work, "preload-src")
	if err := stage.WriteLayout(src, b.cache.Path, images); err != nil {
		return err
	}
	var pi []preload.Image
	for _, img := range images {
		pi = append(pi, preload.Image{Name: img.Ref, LayoutDir: src, Digest: img.Manifest.Digest.String()})
	}
	_, err := preload.Build(ctx, filepath.Join(b.root, contract.StorageDir), pi,
		preload.WithPlatform("linux", b.Recipe.Arch, ""),
		preload.WithTime(time.Unix(b.Epoch, 0)),
		preload.WithProgress(b.o.Progress))
	return err
}
