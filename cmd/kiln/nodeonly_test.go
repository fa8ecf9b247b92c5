package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The node's edition (-tags nodeonly, shipped as bin/kiln on the image
// partition) must link none of the factory: not its packages, and not the
// libraries that cost the registry its start time (go-runewidth's init, via
// containers/image's copy and its progress bars, took 25 of 30 ms).
func TestNodeEditionLinksNoFactoryCode(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-tags", "containers_image_openpgp,exclude_graphdriver_btrfs,nodeonly", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/kiln-appliance/kiln/builder",
		"github.com/kiln-appliance/kiln/partitions",
		"github.com/kiln-appliance/kiln/recipes",
		"github.com/kiln-appliance/kiln/ignition",
		"github.com/kiln-appliance/kiln/systemd/units",
		"github.com/coreos/ignition",
		"github.com/diskfs/go-diskfs",
		"github.com/google/go-containerregistry/pkg/v1/remote",
		"go.podman.io/image/v5/copy",
		"github.com/vbauerster/mpb",
		"github.com/mattn/go-runewidth",
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("the node edition links %s", d)
			}
		}
	}
	if len(deps) < 50 {
		t.Fatalf("go list -deps listed only %d packages: %v", len(deps), deps)
	}
}
