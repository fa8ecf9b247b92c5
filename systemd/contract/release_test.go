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

// Releases are ordered by semver precedence, the one order the factory's
// bundle, the node's bundle check and its state machine all use.
func TestCompareVersions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"1.0.0", "1.0.0", 0},
		{"1.10.0", "1.9.0", 1},
		{"1.0.0-rc.1", "1.0.0", -1},
		{"1.0.0+build.2", "1.0.0+build.1", 0},
		{"2.0.0", "10.0.0", -1},
	} {
		if got, err := CompareVersions(tc.a, tc.b); err != nil || got != tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, %v; want %d", tc.a, tc.b, got, err, tc.want)
		}
	}
	for _, bad := range []string{"1.0", "v1.0.0", ""} {
		if _, err := CompareVersions(bad, "1.0.0"); err == nil || !strings.Contains(err.Error(), "is not semver: write MAJOR.MINOR.PATCH, e.g. 1.2.0") {
			t.Errorf("CompareVersions(%q): %v", bad, err)
		}
	}
}
