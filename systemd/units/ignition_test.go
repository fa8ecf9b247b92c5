package units_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/units"
)

// What Render returns goes through the ignition package and the result
// passes the real ignition-validate.
func TestRenderedConfigValidates(t *testing.T) {
	units, files, err := units.Render(units.Params{
		PartitionGUID: "0F3C1A2B-1111-4222-8333-444455556666",
		Images:        []contract.Image{{Name: "quay.io/acme/app:1.2", Digest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err := ignition.Render(ignition.Config{Units: units, Files: files})
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
