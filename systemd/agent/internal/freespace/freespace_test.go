package freespace

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Available is what coreutils' stat -f says a user may still write (%a
// blocks of %S bytes), give or take what others write in between.
func TestAvailable(t *testing.T) {
	dir := t.TempDir()
	// stat -f before and after: on a shared machine others write (or
	// delete) meanwhile, so the answer must lie between the two readings.
	before := statAvailable(t, dir)
	got, err := Available(dir)
	if err != nil {
		t.Fatal(err)
	}
	after := statAvailable(t, dir)
	lo, hi := min(before, after), max(before, after)
	const slack = 64 << 20
	if got <= 0 || got < lo-slack || got > hi+slack {
		t.Errorf("Available(%s) = %d, stat -f says %d before and %d after", dir, got, before, after)
	}
}

// statAvailable is what coreutils' stat -f says a user may write in dir.
func statAvailable(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command("stat", "-f", "--format=%a %S", dir).Output()
	if err != nil {
		t.Fatalf("stat -f: %v", err)
	}
	f := strings.Fields(string(out))
	blocks, err1 := strconv.ParseInt(f[0], 10, 64)
	size, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("stat -f said %q", out)
	}
	return blocks * size
}

func TestAvailableMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	_, err := Available(missing)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Available(missing) = %v; want not-exist naming %s", err, missing)
	}
}
