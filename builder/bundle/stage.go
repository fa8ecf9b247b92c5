package bundle

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-appliance/kiln/builder/output"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// makeWorkDir removes what killed runs left and makes this run's staging
// directory, in the cache directory so blobs are hard links.
func (b *bundler) makeWorkDir(context.Context) error {
	workDir := output.Work{Dir: b.o.CacheDir, Prefix: workDirPrefix}
	output.Sweep(b.o.Output, "bundle run", b.o.Log, workDir)
	work, err := output.MkdirWork(workDir)
	if err != nil {
		return fmt.Errorf("staging directory: %w", err)
	}
	b.work, b.tree = work, filepath.Join(work, "tree")
	return nil
}

// stageImages lays out the blobs on the stick as an OCI layout and records
// their layers' unpacked sizes in the manifest.
func (b *bundler) stageImages(ctx context.Context) error {
	onStick := map[string]bool{}
	for _, blob := range b.m.Blobs {
		onStick[blob.Digest] = blob.OnStick
	}
	var si []stage.Image
	for i, img := range b.images {
		var blobs []v1.Hash
		for _, d := range img.Blobs() {
			blobs = append(blobs, d.Digest)
		}
		si = append(si, stage.Image{Ref: b.Recipe.Images[i].Name, Manifest: img.Descriptor, Blobs: blobs})
	}
	task := b.o.Progress.Task("stage bundle", 0)
	err := stage.WriteLayout(filepath.Join(b.tree, bundlefmt.OCIDir), b.cache.Path, si,
		stage.OnlyBlobs(func(h v1.Hash) bool { return onStick[h.String()] }))
	task.Done(err)
	if err != nil {
		return err
	}
	return b.unpackedSizes(ctx)
}

// stageFiles copies the release files and, when the stick carries it, the
// agent into the tree, and lists every file of the tree in the manifest.
func (b *bundler) stageFiles(context.Context) error {
	r, m, tree := b.Recipe, b.m, b.tree
	for _, f := range r.Release.Files {
		dst := filepath.Join(tree, bundlefmt.ReleaseDir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := stage.CopyFile(r.Resolve(f.Source), dst, os.FileMode(f.FileMode())); err != nil {
			return fmt.Errorf("release file %s: %w", f.Path, err)
		}
		digest, size, err := filedigest.Of(dst)
		if err != nil {
			return err
		}
		m.ReleaseFiles = append(m.ReleaseFiles, contract.ReleaseFile{Path: f.Path, Mode: f.FileMode(), Size: size, Digest: digest})
	}
	sort.Slice(m.ReleaseFiles, func(i, j int) bool { return m.ReleaseFiles[i].Path < m.ReleaseFiles[j].Path })
	if m.AgentOnStick {
		if err := os.MkdirAll(filepath.Join(tree, path.Dir(bundlefmt.AgentBinary)), 0o755); err != nil {
			return err
		}
		if err := stage.CopyFile(b.Agent.Path, filepath.Join(tree, bundlefmt.AgentBinary), 0o755); err != nil {
			return fmt.Errorf("copy agent binary %s: %w", b.Agent.Path, err)
		}
	}
	files, err := stage.ListFiles(tree)
	if err != nil {
		return err
	}
	for _, f := range files {
		m.Files = append(m.Files, bundlefmt.File{Path: f.Path, Size: f.Size, Digest: f.Digest})
	}
	return nil
}

// unpackedSizes measures each layer on the stick uncompressed (gzip, zstd or
// plain tar, told by its first bytes), for the node's space check.
func (b *bundler) unpackedSizes(ctx context.Context) error {
	m, layers := b.m, b.layers
	var total int64
	for i := range m.Blobs {
		if layers[m.Blobs[i].Digest] {
			total += m.Blobs[i].Size
		}
	}
	task := b.o.Progress.Task("measure unpacked layers", total)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i := range m.Blobs {
		blob := &m.Blobs[i]
		if !layers[blob.Digest] {
			continue
		}
		g.Go(func() error {
			h, err := v1.NewHash(blob.Digest)
			if err != nil {
				return err
			}
			n, err := unpackedSize(ctx, b.cache.Path(h), task)
			if err != nil {
				return fmt.Errorf("layer %s: %w", blob.Digest, err)
			}
			blob.Unpacked = n
			return nil
		})
	}
	err := g.Wait()
	task.Done(err)
	if err != nil {
		return err
	}
	for _, blob := range m.Blobs {
		m.Space.UnpackedBytes += blob.Unpacked
	}
	return nil
}

func unpackedSize(ctx context.Context, p string, task io.Writer) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	magic := make([]byte, 4)
	n, _ := f.ReadAt(magic, 0)
	magic = magic[:n]
	gz := len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b
	zst := len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd
	if !gz && !zst { // a plain tar: its size is its unpacked size
		st, err := f.Stat()
		if err != nil {
			return 0, err
		}
		progress.Count(task, st.Size())
		return st.Size(), nil
	}
	br := bufio.NewReaderSize(io.TeeReader(ctxReader{ctx, f}, task), 1<<20)
	var r io.Reader = br
	switch {
	case gz:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return 0, err
		}
		defer zr.Close()
		r = zr
	case zst:
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return 0, err
		}
		defer zr.Close()
		r = zr
	}
	return io.Copy(io.Discard, r)
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
