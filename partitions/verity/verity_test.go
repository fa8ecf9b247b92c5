package verity

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
)

const mib = 1 << 20

// TestVerityMatchesVeritysetup: kiln's tree, superblock and root hash are
// byte for byte what `veritysetup format` writes, at level counts 1 to 3.
func TestVerityMatchesVeritysetup(t *testing.T) {
	salt := bytes.Repeat([]byte{0xa5}, 32)
	id := uuid.MustParse("0b9c1d2e-3f40-4152-8364-758697a8b9ca")
	for _, blocks := range []int64{2, 128, 129, 1280, 16385} {
		t.Run(fmt.Sprint(blocks), func(t *testing.T) {
			dir := t.TempDir()
			data := make([]byte, blocks*Block)
			rand.Read(data)
			mine, theirs := filepath.Join(dir, "kiln"), filepath.Join(dir, "veritysetup")
			for _, p := range []string{mine, theirs} {
				if err := os.WriteFile(p, data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			f, err := os.OpenFile(mine, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			v, err := Tree{Data: f, Out: f, DataBlocks: blocks, HashOffset: blocks * Block, Salt: salt, UUID: id}.Write(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("veritysetup", "format", theirs, theirs,
				fmt.Sprintf("--hash-offset=%d", blocks*Block), fmt.Sprintf("--data-blocks=%d", blocks),
				"--salt="+v.Salt, "--uuid="+id.String()).CombinedOutput()
			if err != nil {
				t.Fatalf("veritysetup: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), v.RootHash) {
				t.Errorf("root hash %s, veritysetup says:\n%s", v.RootHash, out)
			}
			a, _ := os.ReadFile(mine)
			b, _ := os.ReadFile(theirs)
			if !bytes.Equal(a, b) {
				t.Errorf("kiln wrote %d bytes, veritysetup %d; they differ", len(a), len(b))
			}
			if int64(len(a)) != blocks*Block+v.HashSize {
				t.Errorf("HashSize %d, file has %d bytes past the data", v.HashSize, int64(len(a))-blocks*Block)
			}
			if err := Check(context.Background(), f, *v); err != nil {
				t.Errorf("check of a good tree: %v", err)
			}
		})
	}
}

// TestVerityNamesTheBadBlock: a changed byte of the data is named by block
// (and veritysetup verify agrees on the position); a changed byte of the
// tree or superblock, or another root hash, is refused as such.
func TestVerityNamesTheBadBlock(t *testing.T) {
	const blocks = 1280
	salt := bytes.Repeat([]byte{1}, 32)
	id := uuid.MustParse("0b9c1d2e-3f40-4152-8364-758697a8b9ca")
	data := make([]byte, blocks*Block)
	rand.Read(data)
	good := filepath.Join(t.TempDir(), "good")
	os.WriteFile(good, data, 0o600)
	f, _ := os.OpenFile(good, os.O_RDWR, 0)
	v, err := Tree{Data: f, Out: f, DataBlocks: blocks, HashOffset: blocks * Block, Salt: salt, UUID: id}.Write(context.Background())
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	img, _ := os.ReadFile(good)
	other := *v
	other.RootHash = strings.Repeat("ab", 32)
	for _, c := range []struct {
		name  string
		flip  int64 // byte to flip, -1 none
		v     Verity
		block int64
		want  string
	}{
		{"data", 1000*Block + 17, *v, 1000, "data block 1000 (bytes 4096000-4100095"},
		{"first data byte", 0, *v, 0, "data block 0 "},
		{"superblock", blocks*Block + 80, *v, -1, "verity superblock"},
		{"level 0", blocks*Block + 3*Block + 5, *v, -1, "level 0, block 1 "},
		{"top level", blocks*Block + Block + 5, *v, -1, "root hash"},
		{"top level padding", blocks*Block + 2*Block - 1, *v, -1, "root hash"},
		{"another build's root hash", -1, other, -1, "the record says " + other.RootHash},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := append([]byte(nil), img...)
			if c.flip >= 0 {
				b[c.flip] ^= 0x10
			}
			err := Check(context.Background(), bytes.NewReader(b), c.v)
			var ve *Error
			if !errors.As(err, &ve) || ve.Block != c.block || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want block %d and %q", err, c.block, c.want)
			}
			if c.name == "data" {
				p := filepath.Join(t.TempDir(), "bad")
				os.WriteFile(p, b, 0o600)
				out, _ := exec.Command("veritysetup", "verify", p, p, v.RootHash, fmt.Sprintf("--hash-offset=%d", v.HashOffset)).CombinedOutput()
				if want := fmt.Sprintf("position %d", 1000*Block); !strings.Contains(string(out), want) {
					t.Errorf("veritysetup verify says %q, want %q", out, want)
				}
			}
		})
	}
}

// The verity pass feeds files that start anywhere (not block aligned) and
// span its regions' cuts: each digest is the file's, and the tree is the one
// written without files.
func TestVerityFeedsFiles(t *testing.T) {
	const size = 80 << 20
	data := make([]byte, size)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "part")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	salt := bytes.Repeat([]byte{7}, 32)
	tree := Tree{Data: f, Out: f, DataBlocks: size / Block, HashOffset: size, Salt: salt}
	plain, err := tree.Write(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Contiguous files from byte 96 (after a superblock), one with a sparse
	// block between its stored ones, one empty, one of a single byte.
	ff := &Files{}
	want := map[string]string{}
	pos := int64(96)
	for i, n := range []int64{10<<20 + 123, 1, 0, 33<<20 + 7, 5 << 20, 20<<20 - 999} {
		fh := &fileHasher{File: squashfs.File{Path: fmt.Sprint(i), Size: n, Start: pos}, h: sha256.New()}
		content := data[pos : pos+n]
		if i == 4 { // 2 MiB stored, a 1 MiB sparse block, 3 MiB stored
			fh.Size = n + mib
			fh.Extents = []squashfs.Extent{{Off: pos, N: 2 * mib}, {Off: pos + 2*mib, N: mib, Sparse: true}, {Off: pos + 2*mib, N: 3 * mib}}
			content = append(append(append([]byte{}, data[pos:pos+2*mib]...), make([]byte, mib)...), data[pos+2*mib:pos+n]...)
		} else if n > 0 {
			fh.Extents = []squashfs.Extent{{Off: pos, N: n}}
		}
		want[fh.Path] = fmt.Sprintf("sha256:%x", sha256.Sum256(content))
		ff.files = append(ff.files, fh)
		pos += n
	}
	if err := os.WriteFile(path, data, 0o600); err != nil { // the tree above wrote past the data: start again
		t.Fatal(err)
	}
	tree.Files = ff
	v, err := tree.Write(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v.RootHash != plain.RootHash {
		t.Errorf("root hash with files %s, without %s", v.RootHash, plain.RootHash)
	}
	sums, err := ff.Finish()
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range want {
		if sums[name].Digest != d {
			t.Errorf("file %s: digest %s, want %s", name, sums[name].Digest, d)
		}
	}
	if len(dataRegions(size/Block, ff)) < 2 {
		t.Error("the files fit one region: the test does not cross a cut")
	}
}

// TestCheckStopsWhenCancelled (issue 26, item 7): the verity check of kiln
// verify reads a whole partition, for minutes on a large one; once the
// CLI's context is done (Ctrl-C, SIGTERM) it stops at the next read instead
// of hashing to the end.
func TestCheckStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := &fixtures.CountingReaderAt{R: bytes.NewReader(make([]byte, 128*mib))}
	if _, err := (level{src: r, n: 128 * mib / Block}).check(ctx, r); !errors.Is(err, context.Canceled) || r.N.Load() > 0 {
		t.Errorf("verity check, cancelled: %v after reading %d bytes; want context.Canceled, nothing read", err, r.N.Load())
	}
}
