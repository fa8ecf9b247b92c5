package gate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// registriesConf is the part of registries.conf (v2) the drop-in sets.
type registriesConf struct {
	Registry []struct {
		Prefix   string `toml:"prefix"`
		Location string `toml:"location"`
		Mirror   []struct {
			Location       string `toml:"location"`
			Insecure       bool   `toml:"insecure"`
			PullFromMirror string `toml:"pull-from-mirror"`
		} `toml:"mirror"`
	} `toml:"registry"`
}

// TestDropInQuotesAsTOML: the drop-in goes through the TOML encoder, so an
// upstream from kiln.json with characters Go's %q and TOML quote
// differently (BEL and VT: Go writes \a and \v, which TOML does not have,
// and containers/image would then refuse the whole file) is parsed back
// whole, with every key known to containers/image.
func TestDropInQuotesAsTOML(t *testing.T) {
	upstreams := []string{"bell\a.example", "tab\v.example", `quote".example`, "quay.io"}
	g := &Gate{Listen: "127.0.0.1:5050", Upstreams: upstreams, MirrorTags: true}
	data := g.DropInContents()
	var conf registriesConf
	md, err := toml.Decode(string(data), &conf)
	if err != nil {
		t.Fatalf("drop-in is not TOML: %v\n%s", err, data)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Errorf("keys registries.conf does not have: %v", u)
	}
	if len(conf.Registry) != len(upstreams) {
		t.Fatalf("%d registries, want %d:\n%s", len(conf.Registry), len(upstreams), data)
	}
	for i, r := range conf.Registry {
		h := upstreams[i]
		if r.Prefix != h || r.Location != h || len(r.Mirror) != 1 ||
			r.Mirror[0] != (struct {
				Location       string `toml:"location"`
				Insecure       bool   `toml:"insecure"`
				PullFromMirror string `toml:"pull-from-mirror"`
			}{"127.0.0.1:5050/" + h, true, "all"}) {
			t.Errorf("registry %d = %+v, want prefix/location %q mirrored to 127.0.0.1:5050/%s", i, r, h, h)
		}
	}
	// What fmt's %q wrote before is not TOML.
	old := fmt.Sprintf("[[registry]]\nprefix = %q\n", upstreams[0])
	if _, err := toml.Decode(old, &conf); err == nil || !strings.Contains(old, `\a`) {
		t.Errorf("%q parsed: the test does not tell the quotings apart", old)
	}
}

// TestNewRefusesListen: a kiln.json whose listen address the factory would
// never write (not loopback; a newline that would end the drop-in's comment)
// is refused before anything is written.
func TestNewRefusesListen(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:5050", "127.0.0.1:5050\n[[registry]]", "127.0.0.1:80"} {
		c := &contract.Contents{Registry: contract.Registry{Listen: listen}}
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "listen") {
			t.Errorf("New with listen %q: %v, want an error about the listen address", listen, err)
		}
	}
}
