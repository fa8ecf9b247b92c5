package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
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
	// partitions/uki reads a unified kernel image's sections and checks
	// its signature: a Secure Boot node checks a bundle's image as the
	// factory's verify does, with the same code.
	allowed := []string{"github.com/kiln-appliance/kiln/partitions/uki"}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		if slices.Contains(allowed, d) {
			continue
		}
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

// The node edition's package inits allocate little: kiln serve starts at
// every boot, and a large allocation before main (two 4 MiB buffers once)
// starts a garbage collection then — 10 ms of a 2.2 ms init on a busy
// machine. Bytes, not time, so the check holds on a loaded machine.
func TestNodeEditionInitIsSmall(t *testing.T) {
	t.Parallel()
	const limit = 2 << 20 // 0.7 MiB in all at the time of writing
	agent := filepath.Join(filepath.Dir(kilnBin), "kiln-agent")
	cmd := exec.Command(agent, "--help")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", agent, err, out)
	}
	var total int64
	var biggest string
	var most int64
	for _, line := range strings.Split(string(out), "\n") {
		// init PKG @T ms, C ms clock, N bytes, M allocs
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "init" || f[8] != "bytes," {
			continue
		}
		n, err := strconv.ParseInt(f[7], 10, 64)
		if err != nil {
			t.Fatalf("inittrace line %q: %v", line, err)
		}
		total += n
		if n > most {
			most, biggest = n, f[1]
		}
	}
	if total == 0 {
		t.Fatalf("no inittrace lines from %s:\n%s", agent, out)
	}
	if total > limit {
		t.Errorf("the node edition's package inits allocate %d bytes (over %d); the most: %s, %d bytes — allocate on first use", total, limit, biggest, most)
	}
}
