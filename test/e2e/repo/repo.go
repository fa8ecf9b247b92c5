// Package repo finds the kiln source tree the e2e tests run in.
package repo

import (
	"os"
	"path/filepath"
)

// Root is the nearest directory at or above the working directory (go test
// runs in the package's directory) that holds go.mod: the repository. It does
// not use runtime.Caller, whose paths -trimpath rewrites to module paths.
func Root() string {
	dir, err := os.Getwd()
	if err != nil {
		panic("e2e: no working directory: " + err.Error())
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			panic("e2e: no go.mod at or above " + dir + ": run the tests from the kiln repository")
		}
	}
}
