package contract

import (
	"strings"
	"testing"
)

func TestCheckReleasePath(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"/etc/containers/systemd/app.container", "/etc/kubernetes/manifests/pod.yaml", "/etc/kiln/release/a/b.env"} {
		if err := CheckReleasePath(ok); err != nil {
			t.Errorf("CheckReleasePath(%q): %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"etc/containers/systemd/app.container":     "clean absolute",
		"/etc/containers/systemd/../../passwd":     "clean absolute",
		"/etc/containers/systemd/":                 "clean absolute",
		"/etc/containers/systemd":                  "outside",
		"/etc/passwd":                              "outside",
		"/var/lib/kiln/state.json":                 "outside",
		"/etc/containers/systemdx/app.container":   "outside",
		"/etc/containers/registries.conf.d/a.conf": "outside",
	} {
		if err := CheckReleasePath(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckReleasePath(%q) = %v, want an error saying %q", bad, err, want)
		}
	}
}

// The state file is read strictly: a field this kiln does not know, another
// schema version, or both a staged and a trying release are errors.
func TestDecodeState(t *testing.T) {
	t.Parallel()
	good := `{"schemaVersion":1,"current":{"version":"1.0.0","images":[]},"staged":{"version":"1.1.0","images":[]}}`
	s, err := DecodeState(strings.NewReader(good))
	if err != nil || s.Current.Version != "1.0.0" || s.Staged.Version != "1.1.0" || len(s.Releases()) != 2 || s.Active().Version != "1.0.0" {
		t.Fatalf("DecodeState: %+v, %v", s, err)
	}
	data, err := EncodeState(s)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := DecodeState(strings.NewReader(string(data))); err != nil || again.Staged.Version != "1.1.0" {
		t.Errorf("round trip: %+v, %v", again, err)
	}
	for name, bad := range map[string]string{
		"unknown field":     `{"schemaVersion":1,"current":{"version":"1.0.0","images":[]},"next":{}}`,
		"schema":            `{"schemaVersion":2,"current":{"version":"1.0.0","images":[]}}`,
		"staged and trying": `{"schemaVersion":1,"current":{"version":"1.0.0","images":[]},"staged":{"version":"1.1.0","images":[]},"trying":{"version":"1.2.0","images":[]}}`,
		"not JSON":          `{"schemaVersion":1,`,
	} {
		if _, err := DecodeState(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "release state") {
			t.Errorf("%s: %v, want an error about the release state", name, err)
		}
	}
}
