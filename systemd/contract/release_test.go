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
