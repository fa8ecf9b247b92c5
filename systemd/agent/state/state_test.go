package state

import (
	"errors"
	"fmt"
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

// Failures is Failed with a failure only Last holds added (one an agent
// that predates Failed recorded), a version's older failure replaced by
// it; Failure finds a version's.
func TestFailures(t *testing.T) {
	t.Parallel()
	fail := func(v string, at int64, msg string) Result {
		return Result{Action: "rollback", Version: v, Message: msg, Time: at}
	}
	ok := func(action, v string) *Result { return &Result{Action: action, Version: v, OK: true, Time: 9} }
	last := func(r Result) *Result { return &r }
	for _, tc := range []struct {
		name   string
		failed []Result
		last   *Result
		want   string // version@time of each failure, in order
	}{
		{"none", nil, nil, ""},
		{"last succeeded", nil, ok("confirm", "1.1.0"), ""},
		{"an abandon is no failure", nil, ok("abandon", "1.1.0"), ""},
		{"only last: an older agent's rollback", nil, last(fail("1.1.0", 5, "x")), "1.1.0@5"},
		{"kept after last moved on", []Result{fail("1.1.0", 5, "x")}, ok("stage", "1.1.0"), "1.1.0@5"},
		{"last is the recorded one", []Result{fail("1.1.0", 5, "x")}, last(fail("1.1.0", 5, "x")), "1.1.0@5"},
		{"failed again: the newer replaces it", []Result{fail("1.1.0", 5, "x"), fail("1.2.0", 6, "y")}, last(fail("1.1.0", 7, "z")), "1.2.0@6 1.1.0@7"},
		{"another version added", []Result{fail("1.1.0", 5, "x")}, last(fail("1.2.0", 6, "y")), "1.1.0@5 1.2.0@6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &State{Failed: tc.failed, Last: tc.last}
			var got []string
			for _, f := range s.Failures() {
				got = append(got, fmt.Sprintf("%s@%d", f.Version, f.Time))
				if s.Failure(f.Version) == nil || *s.Failure(f.Version) != f {
					t.Errorf("Failure(%s) = %+v, want %+v", f.Version, s.Failure(f.Version), f)
				}
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("Failures: %q, want %q", g, tc.want)
			}
			if s.Failure("9.9.9") != nil {
				t.Errorf("Failure of a version that never failed: %+v", s.Failure("9.9.9"))
			}
			if len(tc.failed) > 0 && &s.Failures()[0] == &tc.failed[0] {
				t.Errorf("Failures shares Failed's array")
			}
		})
	}
	// The field is written only when there is a failure; a state written
	// without it (by an agent that predates it) has none.
	data, err := Encode(&State{SchemaVersion: Version, Current: contract.Release{Version: "1.0.0"}, Failed: []Result{fail("1.1.0", 5, "x")}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"failed": [`) {
		t.Errorf("encoded state lacks failed:\n%s", data)
	}
	if data, _ := Encode(&State{SchemaVersion: Version}); strings.Contains(string(data), "failed") {
		t.Errorf("a state without failures encodes failed:\n%s", data)
	}
	if s, err := Decode(strings.NewReader(`{"schemaVersion":1,"current":{"version":"1.0.0","images":[]}}`)); err != nil || s.Failed != nil || s.Failures() != nil {
		t.Errorf("a state without failed: %+v, %v", s, err)
	}
}
