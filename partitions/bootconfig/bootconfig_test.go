package bootconfig

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
)

func TestMain(m *testing.M) { fixtures.Main(m) }

// baseCopy copies the generated base and finds its boot partition.
func baseCopy(t *testing.T) (string, *gpt.Partition) {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "base.raw")
	fixtures.CopyRange(t, fixtures.Base(t), 0, fixtures.FileSize(t, fixtures.Base(t)), disk)
	l, err := gpt.Inspect(disk)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := Find(l)
	if err != nil {
		t.Fatal(err)
	}
	return disk, boot
}

// TestWriteReplaces: a second config replaces the first; /ignition that is
// not a directory is an error, not a silent no-op.
func TestWriteReplaces(t *testing.T) {
	disk, boot := baseCopy(t)
	for _, cfg := range []string{`{"ignition":{"version":"3.3.0"},"first":true}`, `{"ignition":{"version":"3.4.0"}}`} {
		if err := Write(disk, boot.Offset, []byte(cfg), fixtures.Epoch, ""); err != nil {
			t.Fatal(err)
		}
		got, err := Read(disk)
		if err != nil || string(got) != cfg {
			t.Fatalf("read back %q, %v; want %q", got, err, cfg)
		}
	}
	if out, err := exec.Command("e2fsck", "-fn", fixtures.Ext4(disk, boot.Offset)).CombinedOutput(); err != nil {
		t.Errorf("e2fsck: %v\n%s", err, out)
	}
	// debugfs quirk check: a file where the directory should be.
	cmd := exec.Command("debugfs", "-w", "-R", "rm /ignition/config.ign", fixtures.Ext4(disk, boot.Offset))
	cmd.Run()
	exec.Command("debugfs", "-w", "-R", "rmdir /ignition", fixtures.Ext4(disk, boot.Offset)).Run()
	src := filepath.Join(t.TempDir(), "f")
	os.WriteFile(src, []byte("x"), 0o644)
	exec.Command("debugfs", "-w", "-R", "write "+src+" ignition", fixtures.Ext4(disk, boot.Offset)).Run()
	if err := Write(disk, boot.Offset, []byte("{}"), fixtures.Epoch, ""); err == nil || !strings.Contains(err.Error(), "/ignition, but it is a regular file, not a directory") {
		t.Errorf("want an error about /ignition, got %v", err)
	}
}

// Every time the Ignition write stamps is the build's, SOURCE_DATE_EPOCH=0
// too (which e2fsprogs would take for "use the clock"): two writes a clock
// second apart give the same bytes.
func TestWriteIsReproducible(t *testing.T) {
	for _, at := range []int64{0, fixtures.Epoch} {
		var sums []string
		for i := 0; i < 2; i++ {
			disk, boot := baseCopy(t)
			if i > 0 {
				time.Sleep(1100 * time.Millisecond) // the clock's second moves on
			}
			if err := Write(disk, boot.Offset, fixtures.Ignition, at, ""); err != nil {
				t.Fatal(err)
			}
			sums = append(sums, fixtures.HashRange(t, disk, boot.Offset, boot.Size))
		}
		if sums[0] != sums[1] {
			t.Errorf("epoch %d: two writes of the same config differ", at)
		}
	}
}
