package guest

import (
	"strings"
	"testing"

	"github.com/coreos/ignition/v2/config/v3_3/types"
)

func TestCheckConfigValidates(t *testing.T) {
	b, err := Validate(CheckConfig("#!/bin/bash\necho 'KILN-E2E: x PASS 100%'\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"enabled":true`, CheckUnit, "systemctl --no-block poweroff", "100%25"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config lacks %q: %s", want, b)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	bad := types.Config{Ignition: types.Ignition{Version: "3.3.0"},
		Storage: types.Storage{Files: []types.File{{Node: types.Node{Path: "relative/path"}}}}}
	if _, err := Validate(bad); err == nil || !strings.Contains(err.Error(), "ignition-validate") {
		t.Errorf("Validate(relative path) error = %v, want ignition-validate's rejection", err)
	}
}
