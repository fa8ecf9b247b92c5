package ignition

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/test/golden"
)

func sampleConfig() Config {
	return Config{
		Units: []Unit{
			{Name: "b.service", Contents: "[Service]\nExecStart=/bin/true\n", Enabled: true},
			{Name: "a.mount", Contents: "[Mount]\nWhat=/dev/x\nWhere=/a\n"},
		},
		Files:   []File{{Path: "/etc/kiln/x.conf", Mode: 0o644, Contents: []byte("x = 1\n")}},
		SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEx7 demo@kiln"},
	}
}

// ignitionValidate runs Debian's ignition-validate, the real validator, on a config.
func ignitionValidate(t *testing.T, cfg []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.ign")
	if err := os.WriteFile(p, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ignition-validate", p).CombinedOutput()
	if err != nil {
		t.Fatalf("ignition-validate: %v\n%s\nconfig: %s", err, out, cfg)
	}
}

func TestRenderValidates(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "3.3.0"} { // Debian's ignition-validate (2.14) knows up to 3.4.0-experimental
		out, err := Render(Config{Version: v, Units: sampleConfig().Units, Files: sampleConfig().Files, SSHKeys: sampleConfig().SSHKeys})
		if err != nil {
			t.Fatalf("version %q: %v", v, err)
		}
		ignitionValidate(t, out)
	}
	for _, v := range []string{"3.4.0", "3.5.0"} {
		out, err := Render(Config{Version: v, Units: sampleConfig().Units})
		if err != nil {
			t.Fatalf("version %q: %v", v, err)
		}
		var got struct{ Ignition struct{ Version string } }
		if err := json.Unmarshal(out, &got); err != nil || got.Ignition.Version != v {
			t.Fatalf("version %q: rendered %s (%v)", v, got.Ignition.Version, err)
		}
	}
}

func TestRenderGolden(t *testing.T) {
	t.Parallel()
	out, err := Render(sampleConfig())
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "sample.ign.golden"), out)
}

func TestRenderMergesFragments(t *testing.T) {
	t.Parallel()
	c := sampleConfig()
	c.Fragments = []Fragment{
		{Name: "old.ign", Data: []byte(`{"ignition":{"version":"3.1.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,hi"}}]}}`)},
		{Name: "override.ign", Data: []byte(`{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"b.service","enabled":false}]}}`)},
	}
	out, err := Render(c)
	if err != nil {
		t.Fatal(err)
	}
	ignitionValidate(t, out)
	s := string(out)
	if !strings.Contains(s, `"/etc/motd"`) || !strings.Contains(s, `"/etc/kiln/x.conf"`) {
		t.Fatalf("fragment file or kiln file missing: %s", s)
	}
	if !strings.Contains(s, `"enabled":false,"name":"b.service"`) {
		t.Fatalf("fragment did not override unit: %s", s)
	}
}

func TestRenderErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"bad version", Config{Version: "2.2.0"}, `ignition spec version "2.2.0" is not supported`},
		{"fragment not json", Config{Fragments: []Fragment{{Name: "f.ign", Data: []byte("{")}}}, "ignition fragment f.ign"},
		{"fragment newer than output", Config{Fragments: []Fragment{{Name: "new.ign", Data: []byte(`{"ignition":{"version":"3.4.0"}}`)}}}, "ignition fragment new.ign"},
		{"fragment invalid", Config{Fragments: []Fragment{{Name: "bad.ign", Data: []byte(`{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"relative"}]}}`)}}}, "ignition fragment bad.ign"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want error containing %q", err, tt.want)
			}
		})
	}
}
