// Package golden compares test output with a golden file. One switch for
// every package: UPDATE_GOLDEN=1 go test ./... rewrites the files instead.
package golden

import (
	"bytes"
	"os"
	"testing"
)

// Check fails t unless got equals the file at path; with UPDATE_GOLDEN set
// it writes got there instead.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (UPDATE_GOLDEN=1 go test creates it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (UPDATE_GOLDEN=1 go test rewrites it, if the change is intended):\n%s", path, got)
	}
}
