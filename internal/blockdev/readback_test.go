package blockdev

import (
	"context"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/internal/progress"
)

// loop attaches a file of size bytes holding data at its start.
func loop(t *testing.T, size int64, data []byte) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "dev.raw")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v\n%s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "--detach", dev).Run() })
	return dev
}

// ReadBack is what makes "done" true: it must fail on a device that does
// not hold the image's bytes, and on one that ends before the image does.
func TestReadBack(t *testing.T) {
	image := []byte(strings.Repeat("kiln write reads this back ", 40000))
	want := sha256.Sum256(image)
	flipped := append([]byte(nil), image...)
	flipped[len(flipped)/2] ^= 1
	for _, tc := range []struct {
		name    string
		devSize int64
		holds   []byte
		size    int64
		err     string
	}{
		{"identical", 2 << 20, image, int64(len(image)), ""},
		{"one flipped byte", 2 << 20, flipped, int64(len(image)), "the stick did not keep what was written; use another stick"},
		{"blank device", 2 << 20, nil, int64(len(image)), "did not keep what was written"},
		{"device shorter than the image", 512 << 10, image[:512<<10], int64(len(image)), "the device ended after 524288 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := loop(t, tc.devSize, tc.holds)
			err := ReadBack(context.Background(), dev, tc.size, want[:], progress.Discard())
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %v, want an error with %q", err, tc.err)
			}
		})
	}
}
