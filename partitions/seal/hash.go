package seal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"hash"
	"io"
	"runtime"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/opencontainers/go-digest"
)

// mib is the unit of reads.
const mib = 1 << 20

// sealChunk is the unit of the seal's digests since version 2: a span's
// digest is the sha256 of the sha256s of its sealChunk-byte chunks (the last
// one shorter), in order. Most of a disk is zeros (a base's free space, the
// image partition's headroom), and a chunk of zeros then costs a constant
// instead of sha256 over a MiB: the seal of a 1.6 GiB disk took 0.2 s of
// hashing zeros. Version 1 disks (a plain sha256 of the span) still verify.
const sealChunk = mib

// zeroChunkDigest is sha256 of sealChunk zero bytes.
var zeroChunkDigest = sync.OnceValue(func() [sha256.Size]byte { return sha256.Sum256(zeroBlock[:sealChunk]) })

// sealHash is a seal digest being computed: io.Writer, plus WriteZeros for
// holes, and digest() once at the end.
type sealHash interface {
	Write(p []byte) (int, error)
	WriteZeros(n int64)
	digest() string
}

func newSealHash(version int) sealHash {
	if version == 1 {
		return plainHash{sha256.New()}
	}
	return &chunkedHash{outer: sha256.New(), inner: sha256.New()}
}

// parallelSpan is the size above which a version 2 digest is computed on
// every CPU: its chunks are independent, so each CPU hashes a run of them
// and the runs' chunk digests are hashed in order.
const parallelSpan = 64 * mib

// span is the digest of size bytes of the disk at off.
func (d digests) span(ctx context.Context, off, size int64) (string, error) {
	r := d.r
	cpus := int64(runtime.GOMAXPROCS(0))
	if d.version == 1 || size < parallelSpan || cpus == 1 {
		h := newSealHash(d.version)
		if err := hashSpan(ctx, h, r, span{off, size}, make([]byte, mib)); err != nil {
			return "", err
		}
		return h.digest(), nil
	}
	per := (size/cpus + sealChunk - 1) / sealChunk * sealChunk // whole chunks, so the runs join
	runs := make([]bytes.Buffer, (size+per-1)/per)
	var g errgroup.Group
	for i := range runs {
		from := int64(i) * per
		g.Go(func() error {
			c := &chunkedHash{outer: &runs[i], inner: sha256.New()}
			if err := hashSpan(ctx, c, r, span{off + from, min(per, size-from)}, make([]byte, mib)); err != nil {
				return err
			}
			c.endChunk()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return "", err
	}
	outer := sha256.New()
	for i := range runs {
		outer.Write(runs[i].Bytes())
	}
	return digest.NewDigest(digest.SHA256, outer).String(), nil
}

// plainHash is version 1's digest: sha256 of every byte.
type plainHash struct{ hash.Hash }

func (p plainHash) WriteZeros(n int64) { writeZeros(p.Hash, n) }

func (p plainHash) digest() string { return digest.NewDigest(digest.SHA256, p).String() }

// chunkedHash is version 2's digest.
type chunkedHash struct {
	outer io.Writer // the chunks' digests: a hash.Hash, or a run's buffer (digests.span)
	inner hash.Hash
	n     int // bytes of the current chunk hashed into inner
	sum   [sha256.Size]byte
}

// Write hashes p; a whole chunk of zeros that starts on a chunk boundary
// (a device read back, where holes cannot be told) costs a comparison.
func (c *chunkedHash) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if c.n == 0 && len(p) >= sealChunk && bytes.Equal(p[:sealChunk], zeroBlock[:sealChunk]) {
			z := zeroChunkDigest()
			c.outer.Write(z[:])
			p = p[sealChunk:]
			continue
		}
		k := min(len(p), sealChunk-c.n)
		c.inner.Write(p[:k])
		c.n += k
		p = p[k:]
		if c.n == sealChunk {
			c.endChunk()
		}
	}
	return total, nil
}

// WriteZeros hashes n zero bytes: the chunk under way is filled, whole
// chunks are the constant, the rest starts the next chunk.
func (c *chunkedHash) WriteZeros(n int64) {
	for n > 0 && c.n != 0 {
		k := min(n, int64(sealChunk-c.n))
		c.Write(zeroBlock[:k])
		n -= k
	}
	z := zeroChunkDigest()
	for ; n >= sealChunk; n -= sealChunk {
		c.outer.Write(z[:])
	}
	c.Write(zeroBlock[:n])
}

// endChunk ends the chunk under way, if any.
func (c *chunkedHash) endChunk() {
	if c.n == 0 {
		return
	}
	c.outer.Write(c.inner.Sum(c.sum[:0]))
	c.inner.Reset()
	c.n = 0
}

func (c *chunkedHash) digest() string {
	c.endChunk()
	return digest.NewDigest(digest.SHA256, c.outer.(hash.Hash)).String()
}
