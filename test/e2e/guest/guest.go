// Package guest builds what the e2e tests run inside a booted image: an
// Ignition config fragment that installs a check script and a unit that runs
// it once the system is up, prints its "KILN-E2E: <name> PASS|FAIL <detail>"
// lines to the console and powers the machine off (see package vm).
//
// Scenarios merge the fragment into the config under test (kiln's own, or a
// plain one) so the checks are delivered the same way as everything else:
// through Ignition at first boot.
package guest

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/coreos/ignition/v2/config/v3_3/types"

	"github.com/kiln-appliance/kiln/test/e2e/rawdisk"
	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

// CheckUnit is the name of the unit that runs the check script.
const CheckUnit = "kiln-e2e-check.service"

// CheckScript is where the check script is installed in the guest.
const CheckScript = "/usr/local/bin/kiln-e2e-check"

// checkUnit runs the check script once the system is up, then powers off
// whatever the outcome, so every boot ends on its own: after the script,
// the way a person does (systemctl, through logind, so the kubelet's
// graceful node shutdown runs; SuccessAction= would bypass logind), with a
// line the harness times the shutdown from (vm.ShutdownMarker); a failure
// powers off at once.
var checkUnit = unitText("kiln e2e checks", "FailureAction=poweroff\n",
	`ExecStartPost=/bin/sh -c 'echo "`+vm.ShutdownMarker+` poweroff requested"; exec systemctl --no-block poweroff'`+"\n")

// scenarioUnit runs a scenario script that spans several boots of one
// machine: the script itself reboots (systemctl --no-block reboot, after the
// shutdown marker, then exits 0) or powers off at the end; only a script that fails powers the machine
// off, so a broken scenario still ends its run.
var scenarioUnit = unitText("kiln e2e scenario checks", "FailureAction=poweroff\n", "")

func unitText(description, actions, after string) string {
	return `[Unit]
Description=` + description + `
After=multi-user.target
` + actions + `
[Service]
Type=oneshot
StandardOutput=journal+console
StandardError=journal+console
ExecStart=` + CheckScript + `
` + after + `
[Install]
WantedBy=multi-user.target
`
}

// ScenarioConfig is CheckConfig for a script that decides when the machine
// reboots and powers off (see vm.WithReboots).
func ScenarioConfig(script string) types.Config {
	cfg := CheckConfig(script)
	unit := scenarioUnit
	cfg.Systemd.Units[0].Contents = &unit
	return cfg
}

// CheckConfig returns a spec 3.3.0 config that installs script as the check
// script and enables the unit that runs it on every boot.
func CheckConfig(script string) types.Config {
	mode := 0o755
	yes := true
	unit := checkUnit
	return types.Config{
		Ignition: types.Ignition{Version: "3.3.0"},
		Storage: types.Storage{Files: []types.File{{
			Node:          types.Node{Path: CheckScript},
			FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: DataURL(script)}},
		}}},
		Systemd: types.Systemd{Units: []types.Unit{{Name: CheckUnit, Enabled: &yes, Contents: &unit}}},
	}
}

// DataURL returns s as an RFC 2397 data URL for an Ignition file source.
func DataURL(s string) *string {
	u := "data:," + url.PathEscape(s)
	return &u
}

// Validate marshals cfg and checks it with the real ignition-validate.
func Validate(cfg types.Config) ([]byte, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kiln-e2e-ign-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "config.ign")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command("ignition-validate", p).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ignition-validate rejects the config: %v: %s", err, out)
	}
	return b, nil
}

// WriteConfig validates cfg and writes it to ignition/config.ign on the
// disk's "boot" partition, where the base image's initramfs looks for it.
func WriteConfig(disk string, cfg types.Config) error {
	b, err := Validate(cfg)
	if err != nil {
		return err
	}
	boot, err := rawdisk.Find(disk, "boot")
	if err != nil {
		return err
	}
	return boot.WriteFile("/ignition/config.ign", b, 0o644)
}
