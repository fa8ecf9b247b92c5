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
	got, err := Available(dir)
	if err != nil {
		t.Fatal(err)
	}
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
	const slack = 64 << 20 // the machine is shared: others write meanwhile
	if want := blocks * size; got <= 0 || got < want-slack || got > want+slack {
		t.Errorf("Available(%s) = %d, stat -f says %d", dir, got, want)
	}
}

func TestAvailableMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	_, err := Available(missing)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Available(missing) = %v; want not-exist naming %s", err, missing)
	}
}
