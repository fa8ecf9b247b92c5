package slot

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var params = Params{Polynomial: 0x3DA3358B4DC173, MinSize: 16 << 10, MaxSize: 64 << 10, AverageBits: 15}

func chunk(tag byte, size uint32) Chunk {
	return Chunk{Digest: sha256.Sum256([]byte{tag}), Size: size}
}

func index(chunks ...Chunk) *Index {
	x := &Index{Params: params, Chunks: chunks}
	for _, c := range chunks {
		x.Size += int64(c.Size)
	}
	return x
}

func encode(t testing.TB, x *Index) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := x.Encode(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestRoundTrip(t *testing.T) {
	for _, x := range []*Index{
		index(),
		index(chunk('a', 20<<10)),
		index(chunk('a', 16<<10), chunk('b', 64<<10), chunk('a', 16<<10), chunk('c', 1)),
	} {
		b := encode(t, x)
		if len(b) != headerSize+entrySize*len(x.Chunks) {
			t.Errorf("%d chunks encode to %d bytes", len(x.Chunks), len(b))
		}
		got, err := Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if !bytes.Equal(encode(t, got), b) || got.Size != x.Size || got.Params != x.Params {
			t.Errorf("round trip changed the index: %+v, want %+v", got, x)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Index)
		want string
	}{
		{"short chunk in the middle", func(x *Index) { x.Chunks[0].Size = 100; x.Size -= 16<<10 - 100 }, "chunk 0 is 100 bytes"},
		{"chunk over the maximum", func(x *Index) { x.Chunks[1].Size = 65<<10 + 1; x.Size += 1<<10 + 1 }, "chunk 1 is"},
		{"empty chunk", func(x *Index) { x.Chunks[2].Size = 0; x.Size-- }, "chunk 2 is 0 bytes"},
		{"sizes do not add up", func(x *Index) { x.Size++ }, "add up to"},
		{"minimum below the floor", func(x *Index) { x.Params.MinSize = 1 << 10 }, "minimum chunk size"},
		{"maximum below the minimum", func(x *Index) { x.Params.MaxSize = 8 << 10 }, "maximum chunk size"},
		{"maximum over the ceiling", func(x *Index) { x.Params.MaxSize = MaxChunkSize + 1 }, "maximum chunk size"},
		{"no average", func(x *Index) { x.Params.AverageBits = 0 }, "average bits"},
		{"negative size", func(x *Index) { x.Size = -1 }, "image size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := index(chunk('a', 16<<10), chunk('b', 64<<10), chunk('c', 1))
			tc.edit(x)
			err := x.Check()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check: %v, want an error with %q", err, tc.want)
			}
			if err := x.Encode(new(bytes.Buffer)); err == nil {
				t.Error("Encode wrote an index Check refuses")
			}
		})
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := encode(t, index(chunk('a', 16<<10), chunk('b', 20<<10)))
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"magic", edit(func(b []byte) []byte { b[0] ^= 1; return b }), "bad magic"},
		{"version", edit(func(b []byte) []byte { b[len(magic)] = 9; return b }), "unknown version"},
		{"padding", edit(func(b []byte) []byte { b[len(magic)+21] = 1; return b }), "padding"},
		{"count over what the size allows", edit(func(b []byte) []byte { b[headerSize-1] = 0x7f; return b }), "chunks for"},
		{"truncated list", good[:len(good)-1], "truncated"},
		{"trailing byte", append(bytes.Clone(good), 0), "after the chunk list"},
		{"size of a chunk", edit(func(b []byte) []byte { b[headerSize] ^= 1; return b }), "add up to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(bytes.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode: %v, want an error with %q", err, tc.want)
			}
			if tc.name == "version" && !errors.Is(err, ErrVersion) {
				t.Errorf("not ErrVersion: %v", err)
			}
		})
	}
}

func TestLacking(t *testing.T) {
	a, b, c, d := chunk('a', 16<<10), chunk('b', 20<<10), chunk('c', 30<<10), chunk('d', 17<<10)
	base := index(a, b, c)
	x := index(d, a, d, c, b, chunk('e', 5))
	got := Lacking(x, base)
	if len(got) != 2 || got[0].Digest != d.Digest || got[0].Offset != 0 ||
		got[1].Digest != chunk('e', 5).Digest || got[1].Offset != int64(d.Size) {
		t.Fatalf("Lacking = %+v, want d at 0 then e after it", got)
	}
	if n := PackSize(got); n != int64(d.Size)+5 {
		t.Errorf("PackSize = %d", n)
	}
	if all := Lacking(x, nil); len(all) != 5 || PackSize(all) != x.Size-int64(d.Size) {
		t.Errorf("Lacking(x, nil) = %d chunks of %d bytes: every distinct chunk once", len(all), PackSize(all))
	}
	if loc := x.Locate()[c.Digest]; loc.Offset != int64(d.Size+a.Size+d.Size) {
		t.Errorf("Locate(c) = %d", loc.Offset)
	}
}

// A delta for two bases carries what either lacks: a node of each finds
// every chunk it lacks in the pack.
func TestLackingAny(t *testing.T) {
	a, b, c, d := chunk('a', 16<<10), chunk('b', 20<<10), chunk('c', 30<<10), chunk('d', 17<<10)
	x := index(a, b, c, d)
	digests := func(ls []Located) (s []byte) {
		for _, l := range ls {
			for _, ch := range []Chunk{a, b, c, d} {
				if ch.Digest == l.Digest {
					s = append(s, "abcd"[slices.Index([]Chunk{a, b, c, d}, ch)])
				}
			}
		}
		return s
	}
	for _, tc := range []struct {
		name  string
		bases []*Index
		want  string
	}{
		{"no base", nil, "abcd"},
		{"one base", []*Index{index(a, c)}, "bd"},
		{"two bases", []*Index{index(a, c), index(a, b)}, "bcd"},
		{"a base of unknown content", []*Index{index(a, b, c, d), nil}, "abcd"},
		{"bases that hold it all", []*Index{x, index(d, c, b, a)}, ""},
	} {
		got := LackingAny(x, tc.bases...)
		if string(digests(got)) != tc.want {
			t.Errorf("%s: LackingAny = %s, want %s", tc.name, digests(got), tc.want)
		}
		if len(tc.bases) == 1 && !slices.Equal(got, Lacking(x, tc.bases[0])) {
			t.Errorf("%s: LackingAny of one base differs from Lacking", tc.name)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(f, index(chunk('a', 16<<10), chunk('b', 20<<10))))
	f.Add(encode(f, index()))
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := Decode(bytes.NewReader(b))
		if err != nil {
			return
		}
		if !bytes.Equal(encode(t, x), b) {
			t.Fatal("an index Decode accepts encodes to other bytes")
		}
	})
}

func TestVerityCheck(t *testing.T) {
	good := Verity{RootHash: strings.Repeat("ab", 32), Salt: "00ff", UUID: "6b696c6e-736c-6f74-8000-000000000001", DataBlocks: 1}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*Verity)
		want string
	}{
		{func(v *Verity) { v.RootHash = strings.Repeat("AB", 32) }, "root hash"},
		{func(v *Verity) { v.RootHash = "ab" }, "root hash"},
		{func(v *Verity) { v.Salt = "0" }, "salt"},
		{func(v *Verity) { v.Salt = "--uuid=x" }, "salt"},
		{func(v *Verity) { v.UUID = "6B696C6E-736C-6F74-8000-000000000001" }, "UUID"},
		{func(v *Verity) { v.DataBlocks = 0 }, "data blocks"},
	} {
		v := good
		tc.edit(&v)
		if err := v.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%+v) = %v, want an error with %q", v, err, tc.want)
		}
	}
}

// HashSize is what veritysetup format writes (its superblock and tree), for
// one block, one hash block's worth, one more, and two levels.
func TestVerityHashSize(t *testing.T) {
	for _, blocks := range []int64{1, 128, 129, 128*128 + 1} {
		dir := t.TempDir()
		data, hash := filepath.Join(dir, "data"), filepath.Join(dir, "hash")
		os.WriteFile(data, make([]byte, blocks*VerityBlock), 0o644)
		if out, err := exec.Command("veritysetup", "format", data, hash).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		fi, err := os.Stat(hash)
		if err != nil {
			t.Fatal(err)
		}
		if got := (Verity{DataBlocks: blocks}).HashSize(); got != fi.Size() {
			t.Errorf("%d blocks: HashSize %d, veritysetup wrote %d", blocks, got, fi.Size())
		}
	}
}
