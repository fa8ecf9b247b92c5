package verity

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadSlot: what `veritysetup format DATA HASH` made (a slot and its
// own hash partition) is read back with its values, and a changed data
// byte, another root hash or a foreign superblock is refused.
func TestReadSlot(t *testing.T) {
	const salt, id = "6b696c6e2d736c6f74", "6b696c6e-736c-6f74-8000-000000000001"
	for _, blocks := range []int64{2, 129, 16385} {
		t.Run(fmt.Sprint(blocks), func(t *testing.T) {
			dir := t.TempDir()
			data, hash := filepath.Join(dir, "usr-a"), filepath.Join(dir, "usr-a-verity")
			b := make([]byte, blocks*Block)
			rand.Read(b)
			if err := os.WriteFile(data, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(hash, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("veritysetup", "format", data, hash, "--salt="+salt, "--uuid="+id).CombinedOutput()
			if err != nil {
				t.Fatalf("veritysetup: %v\n%s", err, out)
			}
			root := regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`).FindStringSubmatch(string(out))[1]
			df, _ := os.Open(data)
			defer df.Close()
			hf, _ := os.Open(hash)
			defer hf.Close()

			v, err := ReadSlot(context.Background(), df, hf, root)
			if err != nil {
				t.Fatal(err)
			}
			if v.RootHash != root || v.Salt != salt || v.UUID != id || v.DataBlocks != blocks {
				t.Errorf("ReadSlot = %+v, want root %s, salt %s, UUID %s, %d blocks", v, root, salt, id, blocks)
			}

			other := strings.Repeat("0", 64)
			if _, err := ReadSlot(context.Background(), df, hf, other); err == nil || !strings.Contains(err.Error(), "root hash is "+root) {
				t.Errorf("another root hash: %v", err)
			}
			b[(blocks-1)*Block+7] ^= 1
			os.WriteFile(data, b, 0o600)
			var ve *Error
			if _, err := ReadSlot(context.Background(), df, hf, root); !errors.As(err, &ve) || ve.Block != blocks-1 {
				t.Errorf("a changed byte in the last block: %v", err)
			}
		})
	}
	dir := t.TempDir()
	// Chrome OS's format 0 (the salt after the data): not what a slot is.
	data, hash := filepath.Join(dir, "data"), filepath.Join(dir, "hash")
	os.WriteFile(data, make([]byte, 4*Block), 0o600)
	if out, err := exec.Command("veritysetup", "format", "--format=0", data, hash).CombinedOutput(); err != nil {
		t.Fatalf("veritysetup: %v\n%s", err, out)
	}
	df, _ := os.Open(data)
	defer df.Close()
	hf, _ := os.Open(hash)
	defer hf.Close()
	if _, err := ReadSlot(context.Background(), df, hf, strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "format 0") {
		t.Errorf("a format 0 superblock: %v", err)
	}
	zeros := filepath.Join(dir, "zeros")
	os.WriteFile(zeros, make([]byte, 8*Block), 0o600)
	f, _ := os.Open(zeros)
	defer f.Close()
	if _, err := ReadSlot(context.Background(), f, f, strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "no dm-verity superblock") {
		t.Errorf("no superblock: %v", err)
	}
}
