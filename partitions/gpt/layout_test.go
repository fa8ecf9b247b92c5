package gpt

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
)

func TestMain(m *testing.M) { fixtures.Main(m) }

// TestInspectDamaged: Inspect notices a truncated disk and a broken backup
// GPT, and reads a disk through a block device (size from seeking).
func TestInspectDamaged(t *testing.T) {
	disk := fixtures.Base(t)
	l, err := Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := exec.Command("losetup", "-r", "-f", "--show", disk).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(dev))
	defer exec.Command("losetup", "-d", loop).Run()
	if got, err := Inspect(loop); err != nil || got.Size != l.Size || len(got.Partitions) != len(l.Partitions) {
		t.Errorf("Inspect(%s) = %+v, %v", loop, got, err)
	}

	truncated := filepath.Join(t.TempDir(), "truncated.raw")
	fixtures.CopyRange(t, disk, 0, l.Size-fixtures.MiB, truncated)
	if _, err := Inspect(truncated); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated disk: %v", err)
	}

	broken := filepath.Join(t.TempDir(), "broken.raw")
	fixtures.CopyRange(t, disk, 0, l.Size, broken)
	f, err := os.OpenFile(broken, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("XXX"), l.Size-512)
	f.Close()
	if _, err := Inspect(broken); err == nil || !strings.Contains(err.Error(), "no valid backup GPT header") {
		t.Errorf("broken backup: %v", err)
	}
}
