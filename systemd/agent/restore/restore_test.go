package restore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func TestNeeded(t *testing.T) {
	im := func(name string, served, preloaded bool) contract.Image {
		return contract.Image{Name: name, Digest: "sha256:" + strings.Repeat(name[len(name)-1:], 64), Served: served, Preloaded: preloaded}
	}
	a := im("served-a", true, false)    // served only
	b := im("both-b", true, true)       // served and preloaded
	c := im("preloaded-c", false, true) // preloaded only
	d := im("served-d", true, false)
	e := im("loaded-e", true, true)
	rel := func(v string, images ...contract.Image) *contract.Release {
		return &contract.Release{Version: v, Images: images}
	}
	tests := []struct {
		name         string
		s            state.State
		registryRuns bool
		want         []contract.Image
	}{
		{"factory, no registry: every image", state.State{Current: *rel("1.0.0", a, b, c)}, false, []contract.Image{a, b, c}},
		{"factory, first boot: served-only left to the registry", state.State{Current: *rel("1.0.0", a, b, c)}, true, []contract.Image{b, c}},
		{"previous kept, shared image once", state.State{Current: *rel("1.1.0", a, d), Previous: rel("1.0.0", a, b)}, false, []contract.Image{a, d, b}},
		{"trying before previous", state.State{Current: *rel("1.1.0", a), Trying: rel("1.2.0", e, d), Previous: rel("1.0.0", c)}, false, []contract.Image{a, e, d, c}},
		{"upgrade boot: the tried release's served-only images are served", state.State{Current: *rel("1.1.0", a), Trying: rel("1.2.0", e, d)}, true, []contract.Image{e}},
		{"staged: only what its import loaded", state.State{Current: *rel("1.0.0", c), Staged: rel("1.1.0", d, e)}, false, []contract.Image{c, e}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Needed(&tt.s, tt.registryRuns)
			if fmt.Sprint(names(got)) != fmt.Sprint(names(tt.want)) {
				t.Errorf("Needed = %s, want %s", names(got), names(tt.want))
			}
		})
	}
}
