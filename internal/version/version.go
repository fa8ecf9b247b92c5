// Package version says which kiln this binary is: the version and commit
// the Makefile stamps in at link time, the Go toolchain, and the edition
// (kiln, the factory's; kiln-agent, the node's). The factory records it in
// what it writes (kiln.json, a bundle's manifest), so a disk or a stick says
// which kiln made it.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by the Makefile (go build -ldflags "-X …/internal/version.version=…"):
// `git describe --tags --always --dirty` and `git rev-parse HEAD`. The same
// commit gives the same strings, so the build stays reproducible.
var (
	version string
	commit  string
)

// Editions of kiln: one source, two binaries.
const (
	Factory = "factory" // kiln: the builder, and every node command
	Node    = "node"    // kiln-agent (-tags nodeonly): serve and agent only
)

// Unknown is the version of a kiln built without the Makefile's stamp and
// outside a module version (go build in a checkout).
const Unknown = "devel"

// Info says which kiln a binary is, or which kiln wrote a file.
type Info struct {
	Version string `json:"version"`           // git describe of its source, or Unknown
	Commit  string `json:"commit,omitempty"`  // the git commit, when known
	Go      string `json:"go"`                // the Go toolchain it was built with
	Edition string `json:"edition,omitempty"` // Factory or Node
}

// Current is this binary's Info.
func Current() Info {
	i := Info{Version: version, Commit: commit, Go: runtime.Version(), Edition: edition}
	if bi, ok := debug.ReadBuildInfo(); ok {
		i.fill(bi)
	}
	if i.Version == "" {
		i.Version = Unknown
	}
	return i
}

// fill completes what the Makefile did not stamp from the Go build info:
// the module version (a `go install …@v1.2.0` build) and the VCS commit.
func (i *Info) fill(bi *debug.BuildInfo) {
	if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		i.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && i.Commit == "" {
			i.Commit = s.Value
		}
	}
}

// Program is the binary's name: kiln, or kiln-agent for the node's edition.
func (i Info) Program() string {
	if i.Edition == Node {
		return "kiln-agent"
	}
	return "kiln"
}

// String is one line: "kiln-agent v1.2.0 (commit 0123abcd, go1.26.8, node edition)".
func (i Info) String() string {
	var parts []string
	if i.Commit != "" {
		parts = append(parts, "commit "+shortCommit(i.Commit))
	}
	if i.Go != "" {
		parts = append(parts, i.Go)
	}
	if i.Edition != "" {
		parts = append(parts, i.Edition+" edition")
	}
	head := i.Program() + " " + i.Version
	if i.Version == "" {
		head = i.Program() + ", version unknown"
	}
	if len(parts) == 0 {
		return head
	}
	return fmt.Sprintf("%s (%s)", head, strings.Join(parts, ", "))
}

// Text is what --version prints: the program and version on the first
// line, then one "key: value" line each. ParseText reads it back.
func (i Info) Text() string {
	commit := i.Commit
	if commit == "" {
		commit = "unknown"
	}
	return fmt.Sprintf("%s %s\ncommit: %s\ngo: %s\nedition: %s\n", i.Program(), i.Version, commit, i.Go, i.Edition)
}

// ParseText reads what Text wrote (another kiln's --version).
func ParseText(s string) (Info, error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	prog, v, ok := strings.Cut(lines[0], " ")
	if !ok || (prog != "kiln" && prog != "kiln-agent") || v == "" {
		return Info{}, fmt.Errorf("not kiln's --version output: %q", lines[0])
	}
	i := Info{Version: v}
	for _, l := range lines[1:] {
		key, val, _ := strings.Cut(l, ": ")
		switch key {
		case "commit":
			if val != "unknown" {
				i.Commit = val
			}
		case "go":
			i.Go = val
		case "edition":
			i.Edition = val
		}
	}
	return i, nil
}

func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}
