package slotwrite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

// goldenVerity is what `veritysetup format` (cryptsetup 2.6.1) gives for
// random(5, 1 MiB) with this salt and UUID: a change of Seal's parameters
// (block sizes, hash, format) changes the root hash and fails the test.
var goldenVerity = slot.Verity{
	RootHash:   "5cd98494485f3cb8d4efa28c56d3c36fe3ace3497fdfceb7093b83d4173b5893",
	Salt:       "6b696c6e2d736c6f74",
	UUID:       "6b696c6e-736c-6f74-8000-000000000001",
	DataBlocks: 256,
}

func slotFiles(t *testing.T, data []byte) (string, string) {
	t.Helper()
	d := t.TempDir()
	img, hash := filepath.Join(d, "usr-b"), filepath.Join(d, "usr-b-verity")
	if err := os.WriteFile(img, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hash, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	return img, hash
}

func TestSeal(t *testing.T) {
	data := random(5, 1<<20)
	img, hash := slotFiles(t, data)
	if err := Seal(context.Background(), img, hash, goldenVerity); err != nil {
		t.Fatal(err)
	}

	data[700<<10] ^= 1
	img, hash = slotFiles(t, data)
	err := Seal(context.Background(), img, hash, goldenVerity)
	if !errors.Is(err, contract.ErrDamaged) || !strings.Contains(err.Error(), "not the factory's image") {
		t.Fatalf("Seal of a slot with a flipped bit: %v", err)
	}

	bad := goldenVerity
	bad.UUID = "not-a-uuid"
	if err := Seal(context.Background(), img, hash, bad); err == nil || !strings.Contains(err.Error(), "UUID") {
		t.Errorf("Seal with a bad UUID: %v", err)
	}
}
