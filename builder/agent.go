package builder

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/kiln-appliance/kiln/internal/version"
)

// kilnMain is the main package of both kiln editions.
const kilnMain = "github.com/kiln-appliance/kiln/cmd/kiln"

// Agent is the kiln binary the node runs, found and described.
type Agent struct {
	Path    string
	Size    int64
	Version version.Info
}

// FindAgent finds the agent binary (path, else kiln-agent beside this
// executable), checks it is a Linux executable for arch, and says which
// kiln it is.
func FindAgent(ctx context.Context, path, arch string) (*Agent, error) {
	p, err := agentBinary(path, arch)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	v, err := describeAgent(ctx, p)
	if err != nil {
		return nil, err
	}
	return &Agent{Path: p, Size: fi.Size(), Version: v}, nil
}

// describeAgent says which kiln the agent binary at path is: its edition
// and Go version from its Go build info (readable for any arch), and its
// version and commit from its own --version when this machine can run it
// (the Makefile stamps them at link time, where the build info does not
// keep them). A binary that is not kiln is refused; one too old to have
// --version, or for another arch, has an empty Version.
func describeAgent(ctx context.Context, path string) (version.Info, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return version.Info{}, fmt.Errorf("agent binary %s is not kiln: %w", path, err)
	}
	if bi.Path != kilnMain {
		return version.Info{}, fmt.Errorf("agent binary %s is not kiln: it is the Go program %s", path, bi.Path)
	}
	info := version.Info{Go: bi.GoVersion, Edition: version.Factory}
	arch := ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "-tags":
			if strings.Contains(","+s.Value+",", ",nodeonly,") {
				info.Edition = version.Node
			}
		case "GOARCH":
			arch = s.Value
		}
	}
	if arch != runtime.GOARCH {
		return info, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Env = []string{} // nothing of the factory's environment
	out, err := cmd.Output()
	if err != nil {
		return info, nil // a kiln from before --version
	}
	if v, err := version.ParseText(string(out)); err == nil {
		info.Version, info.Commit = v.Version, v.Commit
	}
	return info, nil
}
