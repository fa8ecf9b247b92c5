package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// The state file is read strictly: a field this kiln does not know, another
// schema version, or both a staged and a trying release are errors.
func TestDecode(t *testing.T) {
	t.Parallel()
	good := `{"schemaVersion":1,"current":{"version":"1.0.0","images":[]},"staged":{"version":"1.1.0","images":[]}}`
	s, err := Decode(strings.NewReader(good))
	if err != nil || s.Current.Version != "1.0.0" || s.Staged.Version != "1.1.0" || len(s.Releases()) != 2 || s.Active().Version != "1.0.0" {
		t.Fatalf("Decode: %+v, %v", s, err)
	}
	data, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Decode(strings.NewReader(string(data))); err != nil || again.Staged.Version != "1.1.0" {
		t.Errorf("round trip: %+v, %v", again, err)
	}
	// A later agent's field: the release before's agent reads on.
	if s, err := Decode(strings.NewReader(`{"schemaVersion":1,"current":{"version":"1.0.0","images":[],"later":1},"next":{}}`)); err != nil || s.Current.Version != "1.0.0" {
		t.Errorf("a later agent's fields: %+v, %v", s, err)
	}
	for name, bad := range map[string]string{
		"schema":            `{"schemaVersion":2,"current":{"version":"1.0.0","images":[]}}`,
		"staged and trying": `{"schemaVersion":1,"current":{"version":"1.0.0","images":[]},"staged":{"version":"1.1.0","images":[]},"trying":{"version":"1.2.0","images":[]}}`,
		"not JSON":          `{"schemaVersion":1,`,
	} {
		if _, err := Decode(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "release state") {
			t.Errorf("%s: %v, want an error about the release state", name, err)
		}
	}
}

// Read is the one reader of the state file: a missing file is
// os.ErrNotExist (no release recorded yet), a symlink is refused (it could
// point anywhere on the node), and so is a file over the limit.
func TestRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if _, err := Read(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a missing file: %v, want os.ErrNotExist", err)
	}
	data, err := Encode(&State{SchemaVersion: Version, Current: contract.Release{Version: "1.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := Read(p); err != nil || s.Current.Version != "1.0.0" {
		t.Errorf("Read: %+v, %v", s, err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(link); err == nil || !strings.Contains(err.Error(), "is a symbolic link, not a regular file") {
		t.Errorf("Read of a symlink: %v", err)
	}
	if err := os.Truncate(p, maxSize+1); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); err == nil || !strings.Contains(err.Error(), "is 67108865 bytes, over the limit of 67108864 (64.0 MiB)") {
		t.Errorf("Read of a file over the limit: %v", err)
	}
}
