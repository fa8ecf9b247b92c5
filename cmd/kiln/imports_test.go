package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The contract (systemd/contract) is the one bridge between the factory and
// the node (docs/architecture.md): each side imports it and nothing of the
// other (the node edition: TestNodeEditionLinksNoFactoryCode), the contract
// imports neither, and the helpers in internal/ import none of the three.
func TestImportRules(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kiln-appliance/kiln/"
	factory := []string{"builder", "partitions", "recipes", "ignition", "systemd/units"}
	var factoryPatterns []string
	for _, f := range factory {
		factoryPatterns = append(factoryPatterns, f+"/...")
	}
	for _, tc := range []struct {
		name      string
		packages  []string // go list patterns, below the module
		forbidden []string // packages (and those below them) none of them may import
	}{
		{"the factory imports nothing of the node", factoryPatterns, []string{"systemd/agent"}},
		{"the contract imports neither side", []string{"systemd/contract/..."}, append([]string{"systemd/agent"}, factory...)},
		{"internal imports no side and no contract", []string{"internal/..."}, append([]string{"systemd", "cmd"}, factory...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var patterns []string
			for _, p := range tc.packages {
				patterns = append(patterns, mod+p)
			}
			args := append([]string{"list", "-deps", "-test", "-tags", "containers_image_openpgp,exclude_graphdriver_btrfs"}, patterns...)
			out, err := exec.Command("go", args...).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			var own int
			for _, d := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				d, _, _ = strings.Cut(d, " ") // a package as its tests see it: "pkg [pkg.test]"
				rel, ok := strings.CutPrefix(d, mod)
				if !ok {
					continue
				}
				own++
				for _, f := range tc.forbidden {
					if rel == f || strings.HasPrefix(rel, f+"/") {
						t.Errorf("%s imports %s", strings.Join(tc.packages, ", "), rel)
					}
				}
			}
			if own == 0 {
				t.Fatalf("go list -deps %v listed none of kiln's packages:\n%s", patterns, out)
			}
		})
	}
}
