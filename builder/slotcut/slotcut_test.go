package slotcut

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

func random(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func cut(t *testing.T, b []byte) *slot.Index {
	t.Helper()
	x, err := Cut(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// rebuild puts an image together from a base image and a pack, as the node
// does, checking every chunk.
func rebuild(t *testing.T, x, base *slot.Index, baseImage, pack []byte) []byte {
	t.Helper()
	inPack := map[[32]byte]slot.Located{}
	for _, c := range slot.Lacking(x, base) {
		inPack[c.Digest] = c
	}
	inBase := base.Locate()
	var out []byte
	for _, c := range x.Chunks {
		var b []byte
		if p, ok := inPack[c.Digest]; ok {
			b = pack[p.Offset : p.Offset+int64(c.Size)]
		} else {
			l := inBase[c.Digest]
			b = baseImage[l.Offset : l.Offset+int64(c.Size)]
		}
		if sha256.Sum256(b) != c.Digest {
			t.Fatalf("chunk at %d does not match", len(out))
		}
		out = append(out, b...)
	}
	return out
}

func TestCutIsStableAndBounded(t *testing.T) {
	img := random(1, 8<<20)
	x := cut(t, img)
	if y := cut(t, img); len(x.Chunks) != len(y.Chunks) || x.Chunks[len(x.Chunks)-1] != y.Chunks[len(y.Chunks)-1] {
		t.Fatal("the same bytes cut differently")
	}
	if x.Size != int64(len(img)) {
		t.Fatalf("index of %d bytes for %d", x.Size, len(img))
	}
	avg := x.Size / int64(len(x.Chunks))
	if avg < 8<<10 || avg > 32<<10 {
		t.Errorf("average chunk %d bytes, want about 16 KiB", avg)
	}
	if _, err := CutWith(bytes.NewReader(img), slot.Params{Polynomial: 4, MinSize: 16 << 10, MaxSize: 64 << 10, AverageBits: 15}); err == nil || !strings.Contains(err.Error(), "irreducible") {
		t.Errorf("a reducible polynomial: %v", err)
	}
}

// An insertion in the middle of an image costs the inserted bytes and the
// chunks around it, not everything after it (which a fixed-size cut would).
func TestDeltaOfAnInsertion(t *testing.T) {
	base := random(2, 16<<20)
	insert := random(3, 100<<10)
	mid := 5<<20 + 12345
	img := append(append(append([]byte{}, base[:mid]...), insert...), base[mid:]...)
	bx, x := cut(t, base), cut(t, img)

	var pack bytes.Buffer
	n, err := WritePack(&pack, bytes.NewReader(img), x, bx)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(pack.Len()) || n != slot.PackSize(slot.Lacking(x, bx)) {
		t.Fatalf("WritePack wrote %d bytes, the buffer holds %d, Lacking says %d", n, pack.Len(), slot.PackSize(slot.Lacking(x, bx)))
	}
	t.Logf("a %d-byte insertion: %d bytes in the pack, %d chunks of %d", len(insert), n, len(slot.Lacking(x, bx)), len(x.Chunks))
	if limit := int64(len(insert)) + 2*int64(Default.MaxSize); n > limit {
		t.Errorf("the delta of a %d-byte insertion is %d bytes, want at most %d", len(insert), n, limit)
	}
	if got := rebuild(t, x, bx, base, pack.Bytes()); !bytes.Equal(got, img) {
		t.Fatal("base + pack is not the new image")
	}
}

func TestWritePackRefusesChangedImage(t *testing.T) {
	img := random(4, 1<<20)
	x := cut(t, img)
	img[600<<10] ^= 1
	_, err := WritePack(new(bytes.Buffer), bytes.NewReader(img), x, nil)
	if err == nil || !strings.Contains(err.Error(), "no longer match") {
		t.Fatalf("WritePack of a changed image: %v", err)
	}
}
