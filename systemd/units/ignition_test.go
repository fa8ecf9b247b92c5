package units_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/systemd/agent/pins"
	"github.com/kiln-appliance/kiln/systemd/units"
)

// What Render returns goes through the ignition package unchanged (the types
// convert) and the result passes the real ignition-validate.
func TestRenderedConfigValidates(t *testing.T) {
	units, files, err := units.Render(units.Params{
		PartitionGUID: "0F3C1A2B-1111-4222-8333-444455556666",
		Images:        []pins.Image{{Name: "quay.io/acme/app:1.2", Digest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var cfg ignition.Config
	for _, u := range units {
		cfg.Units = append(cfg.Units, ignition.Unit(u))
	}
	for _, f := range files {
		cfg.Files = append(cfg.Files, ignition.File(f))
	}
	out, err := ignition.Render(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "config.ign")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ignition-validate", p).CombinedOutput(); err != nil {
		t.Fatalf("ignition-validate: %v\n%s", err, out)
	}
}
