package partitions

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
)

// TestVerityMatchesVeritysetup: kiln's tree, superblock and root hash are
// byte for byte what `veritysetup format` writes, at level counts 1 to 3.
func TestVerityMatchesVeritysetup(t *testing.T) {
	salt := bytes.Repeat([]byte{0xa5}, 32)
	id := uuid.MustParse("0b9c1d2e-3f40-4152-8364-758697a8b9ca")
	for _, blocks := range []int64{2, 128, 129, 1280, 16385} {
		t.Run(fmt.Sprint(blocks), func(t *testing.T) {
			dir := t.TempDir()
			data := make([]byte, blocks*VerityBlock)
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
			v, err := writeVerity(context.Background(), f, f, blocks, blocks*VerityBlock, salt, id, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("veritysetup", "format", theirs, theirs,
				fmt.Sprintf("--hash-offset=%d", blocks*VerityBlock), fmt.Sprintf("--data-blocks=%d", blocks),
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
			if int64(len(a)) != blocks*VerityBlock+v.HashSize {
				t.Errorf("HashSize %d, file has %d bytes past the data", v.HashSize, int64(len(a))-blocks*VerityBlock)
			}
			if err := checkVerity(context.Background(), f, *v); err != nil {
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
	data := make([]byte, blocks*VerityBlock)
	rand.Read(data)
	good := filepath.Join(t.TempDir(), "good")
	os.WriteFile(good, data, 0o600)
	f, _ := os.OpenFile(good, os.O_RDWR, 0)
	v, err := writeVerity(context.Background(), f, f, blocks, blocks*VerityBlock, salt, id, nil, nil)
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
		{"data", 1000*VerityBlock + 17, *v, 1000, "data block 1000 (bytes 4096000-4100095"},
		{"first data byte", 0, *v, 0, "data block 0 "},
		{"superblock", blocks*VerityBlock + 80, *v, -1, "verity superblock"},
		{"level 0", blocks*VerityBlock + 3*VerityBlock + 5, *v, -1, "level 0, block 1 "},
		{"top level", blocks*VerityBlock + VerityBlock + 5, *v, -1, "root hash"},
		{"top level padding", blocks*VerityBlock + 2*VerityBlock - 1, *v, -1, "root hash"},
		{"another build's root hash", -1, other, -1, "the record says " + other.RootHash},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := append([]byte(nil), img...)
			if c.flip >= 0 {
				b[c.flip] ^= 0x10
			}
			err := checkVerity(context.Background(), bytes.NewReader(b), c.v)
			var ve *VerityError
			if !errors.As(err, &ve) || ve.Block != c.block || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want block %d and %q", err, c.block, c.want)
			}
			if c.name == "data" {
				p := filepath.Join(t.TempDir(), "bad")
				os.WriteFile(p, b, 0o600)
				out, _ := exec.Command("veritysetup", "verify", p, p, v.RootHash, fmt.Sprintf("--hash-offset=%d", v.HashOffset)).CombinedOutput()
				if want := fmt.Sprintf("position %d", 1000*VerityBlock); !strings.Contains(string(out), want) {
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
	plain, err := writeVerity(context.Background(), f, f, size/VerityBlock, size, salt, uuid.UUID{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Contiguous files from byte 96 (after a superblock), one with a sparse
	// block between its stored ones, one empty, one of a single byte.
	ff := &fileFeeder{}
	want := map[string]string{}
	pos := int64(96)
	for i, n := range []int64{10<<20 + 123, 1, 0, 33<<20 + 7, 5 << 20, 20<<20 - 999} {
		fh := &fileHasher{path: fmt.Sprint(i), size: n, start: pos, h: sha256.New()}
		content := data[pos : pos+n]
		if i == 4 { // 2 MiB stored, a 1 MiB sparse block, 3 MiB stored
			fh.size = n + MiB
			fh.extents = []fileExtent{{off: pos, n: 2 * MiB}, {off: pos + 2*MiB, n: MiB, sparse: true}, {off: pos + 2*MiB, n: 3 * MiB}}
			content = append(append(append([]byte{}, data[pos:pos+2*MiB]...), make([]byte, MiB)...), data[pos+2*MiB:pos+n]...)
		} else if n > 0 {
			fh.extents = []fileExtent{{off: pos, n: n}}
		}
		want[fh.path] = fmt.Sprintf("sha256:%x", sha256.Sum256(content))
		ff.files = append(ff.files, fh)
		pos += n
	}
	if err := os.WriteFile(path, data, 0o600); err != nil { // the tree above wrote past the data: start again
		t.Fatal(err)
	}
	v, err := writeVerity(context.Background(), f, f, size/VerityBlock, size, salt, uuid.UUID{}, ff, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.RootHash != plain.RootHash {
		t.Errorf("root hash with files %s, without %s", v.RootHash, plain.RootHash)
	}
	sums, err := ff.finish()
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range want {
		if sums[name].Digest != d {
			t.Errorf("file %s: digest %s, want %s", name, sums[name].Digest, d)
		}
	}
	if len(levelRegions(size/VerityBlock, ff)) < 2 {
		t.Error("the files fit one region: the test does not cross a cut")
	}
}
