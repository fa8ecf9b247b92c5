// Package kilnbin builds kiln's two editions for tests that run them as
// programs: the factory's kiln and the node's kiln-agent, static, from this
// repository's cmd/kiln, as `make build` does (without its version stamp).
package kilnbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/kiln-appliance/kiln/test/e2e/repo"
)

// The editions' build tags (the Makefile's TAGS, and the node's nodeonly).
const (
	Factory = "containers_image_openpgp,exclude_graphdriver_btrfs"
	Node    = Factory + ",nodeonly"
)

// Build builds cmd/kiln with tags into path. The repository is found from
// the working directory (go test runs in the package's), not from
// runtime.Caller, whose paths -trimpath turns into module paths.
func Build(tags, path string) error {
	cmd := exec.Command("go", "build", "-tags", tags, "-o", path, "./cmd/kiln")
	cmd.Dir = repo.Root()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build kiln (tags %s): %v\n%s", tags, err, out)
	}
	return nil
}

// RunWithAgent is a TestMain for packages whose tests need the node's
// edition as a program: it builds kiln-agent into a temporary directory,
// sets *agent to its path, runs the tests, removes the directory and exits
// with the tests' code.
func RunWithAgent(m interface{ Run() int }, agent *string) {
	dir, err := os.MkdirTemp("", "kiln-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*agent = filepath.Join(dir, "kiln-agent")
	if err := Build(Node, *agent); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
