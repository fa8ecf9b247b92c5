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

	"github.com/kiln-appliance/kiln/builder/fetch"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
)

// stageTree lays out the bundle's filesystem under tree and completes the
// manifest: unpacked layer sizes, release files, agent, file list.
func stageTree(ctx context.Context, tree string, cache *fetch.Cache, r *recipes.Recipe, images []*fetch.Image, agent string, m *bundle.Manifest, layers map[string]bool, o Options) error {
	onStick := map[string]bool{}
	for _, b := range m.Blobs {
		onStick[b.Digest] = b.OnStick
	}
	var si []stage.Image
	for i, img := range images {
		var blobs []v1.Hash
		for _, d := range img.Blobs() {
			blobs = append(blobs, d.Digest)
		}
		si = append(si, stage.Image{Ref: r.Images[i].Name, Manifest: img.Descriptor, Blobs: blobs})
	}
	task := o.Progress.Task("stage bundle", 0)
	err := stage.WriteLayout(filepath.Join(tree, bundle.OCIDir), cache.Path, si,
		stage.OnlyBlobs(func(h v1.Hash) bool { return onStick[h.String()] }))
	task.Done(err)
	if err != nil {
		return err
	}
	if err := unpackedSizes(ctx, cache, m, layers, o); err != nil {
		return err
	}
	for _, f := range r.Release.Files {
		dst := filepath.Join(tree, bundle.ReleaseDir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := stage.CopyFile(r.Resolve(f.Source), dst, os.FileMode(f.FileMode())); err != nil {
			return fmt.Errorf("release file %s: %w", f.Path, err)
		}
		digest, size, err := stage.HashFile(dst)
		if err != nil {
			return err
		}
		m.ReleaseFiles = append(m.ReleaseFiles, contract.ReleaseFile{Path: f.Path, Mode: f.FileMode(), Size: size, Digest: digest})
	}
	sort.Slice(m.ReleaseFiles, func(i, j int) bool { return m.ReleaseFiles[i].Path < m.ReleaseFiles[j].Path })
	if m.AgentOnStick {
		if err := os.MkdirAll(filepath.Join(tree, path.Dir(bundle.AgentBinary)), 0o755); err != nil {
			return err
		}
		if err := stage.CopyFile(agent, filepath.Join(tree, bundle.AgentBinary), 0o755); err != nil {
			return fmt.Errorf("copy agent binary %s: %w", agent, err)
		}
	}
	files, err := stage.ListFiles(tree)
	if err != nil {
		return err
	}
	for _, f := range files {
		m.Files = append(m.Files, bundle.File{Path: f.Path, Size: f.Size, Digest: f.Digest})
	}
	return nil
}

// unpackedSizes measures each layer on the stick uncompressed (gzip, zstd or
// plain tar, told by its first bytes), for the node's space check.
func unpackedSizes(ctx context.Context, cache *fetch.Cache, m *bundle.Manifest, layers map[string]bool, o Options) error {
	var total int64
	for i := range m.Blobs {
		if layers[m.Blobs[i].Digest] {
			total += m.Blobs[i].Size
		}
	}
	task := o.Progress.Task("measure unpacked layers", total)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i := range m.Blobs {
		b := &m.Blobs[i]
		if !layers[b.Digest] {
			continue
		}
		g.Go(func() error {
			h, err := v1.NewHash(b.Digest)
			if err != nil {
				return err
			}
			n, err := unpackedSize(ctx, cache.Path(h), task)
			if err != nil {
				return fmt.Errorf("layer %s: %w", b.Digest, err)
			}
			b.Unpacked = n
			return nil
		})
	}
	err := g.Wait()
	task.Done(err)
	if err != nil {
		return err
	}
	for _, b := range m.Blobs {
		m.Space.UnpackedBytes += b.Unpacked
	}
	return nil
}

func unpackedSize(ctx context.Context, p string, progress io.Writer) (int64, error) {
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
		countBytes(progress, st.Size())
		return st.Size(), nil
	}
	br := bufio.NewReaderSize(io.TeeReader(ctxReader{ctx, f}, progress), 1<<20)
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

// countBytes reports n bytes done to a progress writer without reading them.
func countBytes(w io.Writer, n int64) {
	var buf [64 << 10]byte
	for n > 0 {
		c := min(n, int64(len(buf)))
		w.Write(buf[:c])
		n -= c
	}
}
