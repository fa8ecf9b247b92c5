package builder

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/recipes"
)

func TestWriteLock(t *testing.T) {
	dir := t.TempDir()
	r, err := recipes.Parse(filepath.Join(dir, "demo.yaml"), []byte(`apiVersion: kiln.dev/v1alpha1
kind: Appliance
name: demo
base: {path: base.raw}
images:
  - name: quay.io/acme/app:1.2
`))
	if err != nil {
		t.Fatal(err)
	}
	lock := func(digest string) *recipes.Lock {
		return recipes.NewLock(r, []recipes.LockedImage{{Name: "quay.io/acme/app:1.2", Source: "docker://quay.io/acme/app:1.2",
			Digest: digest, MediaType: recipes.ManifestMediaTypes[0], Size: 1234}})
	}
	path := filepath.Join(dir, "demo.lock")
	l := lock("sha256:" + strings.Repeat("1", 64))
	if err := WriteLock(l, path, io.Discard); err != nil {
		t.Fatal(err)
	}
	back, err := recipes.ReadLock(path)
	if err != nil {
		t.Fatal(err)
	}
	if back.Path != path || back.Check(r) != nil {
		t.Errorf("read back: %+v, %v", back, back.Check(r))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("mode: %v, %v", fi.Mode(), err)
	}
	before, _ := os.ReadFile(path)

	// A lock that would not read back is refused and the old file kept.
	if err := WriteLock(lock("sha256:nope"), path, io.Discard); err == nil || !strings.Contains(err.Error(), "images[0].digest") {
		t.Errorf("invalid lock written: %v", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("old lock changed by a failed write")
	}

	// A rename that fails (the target is a non-empty directory) leaves the
	// directory alone and no temporary file behind.
	blocked := filepath.Join(dir, "blocked.lock")
	if err := os.MkdirAll(filepath.Join(blocked, "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteLock(l, blocked, io.Discard); err == nil {
		t.Error("write over a directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !reflect.DeepEqual(names, []string{"blocked.lock", "demo.lock"}) {
		t.Errorf("directory holds %v", names)
	}
}
