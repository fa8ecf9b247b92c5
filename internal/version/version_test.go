package version

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestTextRoundTrips(t *testing.T) {
	for _, i := range []Info{
		{Version: "v1.2.0-3-g0123abc-dirty", Commit: "0123abcdef0123abcdef0123abcdef0123abcdef", Go: "go1.26.8", Edition: Node},
		{Version: Unknown, Go: "go1.26.8", Edition: Factory},
	} {
		got, err := ParseText(i.Text())
		if err != nil || got != i {
			t.Errorf("ParseText(%q) = %+v, %v; want %+v", i.Text(), got, err, i)
		}
	}
	for _, bad := range []string{"", "Usage: kiln [command]", "kiln"} {
		if _, err := ParseText(bad); err == nil {
			t.Errorf("ParseText(%q) accepted it", bad)
		}
	}
}

func TestString(t *testing.T) {
	for _, tc := range []struct {
		i    Info
		want string
	}{
		{Info{Version: "v1.2.0", Commit: "0123abcdef0123abcdef", Go: "go1.26.8", Edition: Node}, "kiln-agent v1.2.0 (commit 0123abcdef01, go1.26.8, node edition)"},
		{Info{Version: "devel", Go: "go1.26.8", Edition: Factory}, "kiln devel (go1.26.8, factory edition)"},
		{Info{Go: "go1.26.8", Edition: Node}, "kiln-agent, version unknown (go1.26.8, node edition)"},
		{Info{}, "kiln, version unknown"},
	} {
		if got := tc.i.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.i, got, tc.want)
		}
	}
}

// Unstamped (no -ldflags -X), the version comes from the Go build info: a
// module version when there is one, else Unknown; the commit from VCS.
func TestFillFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		stamped Info
		bi      debug.BuildInfo
		want    Info
	}{
		{Info{}, debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Info{}},
		{Info{}, debug.BuildInfo{Main: debug.Module{Version: "v1.3.0"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}, Info{Version: "v1.3.0", Commit: "abc"}},
		{Info{Version: "v1.3.0-1-gdef", Commit: "def"}, debug.BuildInfo{Main: debug.Module{Version: "v1.3.0"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}, Info{Version: "v1.3.0-1-gdef", Commit: "def"}},
	} {
		got := tc.stamped
		got.fill(&tc.bi)
		if got != tc.want {
			t.Errorf("%+v filled from %+v: %+v, want %+v", tc.stamped, tc.bi.Main, got, tc.want)
		}
	}
	if c := Current(); c.Version == "" || c.Go != runtime.Version() || c.Edition != Factory {
		t.Errorf("Current() = %+v", c)
	}
}
