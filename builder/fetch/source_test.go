package fetch

import (
	"testing"

	"github.com/kiln-appliance/kiln/recipes"
)

// The parser is recipes.ParseSource; this checks what fetch adds: paths
// joined to the recipe's directory.
func TestParseSource(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, base string
		want     source
		bad      bool
	}{
		{in: "docker://quay.io/acme/app:1.2", want: source{Source: recipes.Source{Transport: "docker", Ref: "quay.io/acme/app:1.2"}}},
		{in: "oci:images/app", base: "/r", want: source{Source: recipes.Source{Transport: "oci", Path: "/r/images/app"}}},
		{in: "oci:/abs:1.2", base: "/r", want: source{Source: recipes.Source{Transport: "oci", Path: "/abs", Tag: "1.2"}}},
		{in: "oci:dir:quay.io/acme/app:1.2", base: "/r", want: source{Source: recipes.Source{Transport: "oci", Path: "/r/dir", Tag: "quay.io/acme/app:1.2"}}},
		{in: "docker-archive:app.tar", base: "/r", want: source{Source: recipes.Source{Transport: "docker-archive", Path: "/r/app.tar"}}},
		{in: "docker-archive:app.tar:acme/app:1", base: "/r", want: source{Source: recipes.Source{Transport: "docker-archive", Path: "/r/app.tar", Ref: "acme/app:1"}}},
		{in: "quay.io/acme/app:1.2", bad: true},
		{in: "localhost:5000/app", bad: true},
		{in: "docker:quay.io/app", bad: true},
		{in: "docker://", bad: true},
		{in: "oci:", bad: true},
		{in: "oci::tag", bad: true},
		{in: "dir:/x", bad: true},
		{in: "", bad: true},
	} {
		got, err := parseSource(tc.in, tc.base)
		if tc.bad {
			if err == nil {
				t.Errorf("parseSource(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		tc.want.raw = tc.in
		if err != nil || got != tc.want {
			t.Errorf("parseSource(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
