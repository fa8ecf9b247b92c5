//go:build e2e

package e2e

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/test/e2e/vm"
)

// minCheckNames is how many distinct KILN-E2E check names a full run's
// guests must report: fewer means a check was dropped. A check that moves
// to another scenario keeps its name; one that is removed for good lowers
// this number in the same commit, saying why (docs/e2e.md). The full run
// of 2026-11-28 10:37 (CI, a clean clone) reported 215; the floor is 207,
// the count first reported for a full run that day, leaving room for a few
// names that only a branch taken on some runs reports.
const minCheckNames = 207

// TestMain prints the run's time table (and keeps it beside the console
// logs), and fails a full run whose guests reported fewer distinct checks
// than minCheckNames.
func TestMain(m *testing.M) {
	flag.Parse()
	logs := vm.LogRoot()
	keep := os.MkdirAll(logs, 0o755) == nil
	if keep {
		vm.KeepReport(filepath.Join(logs, "time-table.txt"))
	}
	code := m.Run()
	var table strings.Builder
	vm.WriteReport(&table)
	fmt.Print(table.String())
	if keep {
		os.WriteFile(filepath.Join(logs, "time-table.txt"), []byte(table.String()), 0o644)
		os.WriteFile(filepath.Join(logs, "check-names.txt"), []byte(strings.Join(vm.CheckNames(), "\n")+"\n"), 0o644)
	}
	if full() {
		if n := len(vm.CheckNames()); n < minCheckNames {
			fmt.Printf("FAIL: the guests reported %d distinct check names, fewer than the floor of %d (minCheckNames): a check was dropped (see %s)\n",
				n, minCheckNames, filepath.Join(logs, "check-names.txt"))
			code = 1
		}
	}
	os.Exit(code)
}

// full says whether this run runs every test (no -run, -skip or -short).
func full() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return !testing.Short()
}
