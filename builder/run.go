package builder

import (
	"context"
	"fmt"
	"os"

	"github.com/kiln-appliance/kiln/builder/output"
	"github.com/kiln-appliance/kiln/recipes"
)

// Run is what every factory run (a build, a bundle, a reflash stick)
// starts from, read and checked before any long work.
type Run struct {
	Recipe *recipes.Recipe
	Epoch  int64  // the timestamp of everything written (SourceDateEpoch)
	Agent  *Agent // the node's kiln the output carries
}

// RunOptions are what the commands that start a Run share.
type RunOptions struct {
	// Agent is the node's kiln binary (`make build` writes it as
	// out/kiln-agent: kiln built with the nodeonly tag); empty: kiln-agent
	// beside this executable (refused when there is none), which works only
	// when the recipe's arch is the host's.
	Agent           string
	SourceDateEpoch int64 // 0: $SOURCE_DATE_EPOCH, else DefaultSourceDateEpoch
}

// StartRun loads the recipe at recipePath and checks the files it names
// (recipes.Recipe.CheckFiles), picks the timestamp and finds the agent.
func StartRun(ctx context.Context, recipePath string, o RunOptions) (*Run, error) {
	epoch, err := SourceDateEpoch(o.SourceDateEpoch)
	if err != nil {
		return nil, err
	}
	r, err := recipes.Load(recipePath)
	if err != nil {
		return nil, err
	}
	if err := r.CheckFiles(); err != nil {
		return nil, err
	}
	agent, err := FindAgent(ctx, o.Agent, r.Arch)
	if err != nil {
		return nil, err
	}
	return &Run{Recipe: r, Epoch: epoch, Agent: agent}, nil
}

// Inputs are the files the run reads (the recipe, its lock, the files it
// names, the agent, and more), which its output must not be: agent says
// what the agent is to the output ("the agent binary the bundle carries").
func (r *Run) Inputs(agent string, more ...output.Input) []output.Input {
	inputs := append(output.RecipeInputs(r.Recipe), output.Input{What: agent, Path: r.Agent.Path})
	return append(inputs, more...)
}

// DefaultSourceDateEpoch is the timestamp of every file kiln writes when
// SOURCE_DATE_EPOCH is not set: 1980-01-01, the oldest date FAT can hold.
const DefaultSourceDateEpoch = 315532800

// SourceDateEpoch picks the timestamp of everything a run writes: v, then
// $SOURCE_DATE_EPOCH, then DefaultSourceDateEpoch.
func SourceDateEpoch(v int64) (int64, error) {
	if v != 0 {
		return v, nil
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		var n int64
		if _, err := fmt.Sscan(s, &n); err != nil || n < 0 {
			return 0, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a non-negative number of seconds", s)
		}
		return n, nil
	}
	return DefaultSourceDateEpoch, nil
}
