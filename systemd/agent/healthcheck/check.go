// Package healthcheck decides whether the release the node is trying is
// healthy: the units the recipe names are active and its optional command
// succeeds, within a timeout. `kiln agent release check` confirms or rolls
// back on its answer.
package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Spec is the recipe's health check.
type Spec struct {
	Units   []string      // units that must be active
	Command []string      // optional: a command that must exit 0 (argv, no shell)
	Timeout time.Duration // for all of it
	Every   time.Duration // how often to look again (default 2s)
	// UnhealthyExitCode, optional (1–255; 0: none), is the command's exit
	// status for "broken for good": Run stops at once instead of waiting
	// out the timeout. Any other failure is "not yet".
	UnhealthyExitCode int
}

// ErrUnhealthy is wrapped by Run's error when the command exited with the
// spec's UnhealthyExitCode: the release is broken for good.
var ErrUnhealthy = errors.New("unhealthy")

// ActiveFunc reports whether a unit is active (default: systemctl is-active).
type ActiveFunc func(ctx context.Context, unit string) (bool, error)

// SystemctlActive asks systemd.
func SystemctlActive(ctx context.Context, unit string) (bool, error) {
	err := exec.CommandContext(ctx, "systemctl", "is-active", "--quiet", unit).Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &exit):
		return false, nil // inactive, failed, activating, unknown
	default:
		return false, fmt.Errorf("systemctl is-active %s: %w", unit, err)
	}
}

// Run waits until every unit is active and the command succeeds, looking
// again every s.Every, and returns nil; or, at the timeout, an error that
// says what was still failing (for the console and kiln agent status); or,
// at once, one wrapping ErrUnhealthy when the command exits with
// s.UnhealthyExitCode.
func Run(ctx context.Context, s Spec, active ActiveFunc) error {
	if active == nil {
		active = SystemctlActive
	}
	every := s.Every
	if every <= 0 {
		every = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	last := "" // the last look that ran to its end
	for {
		failing, err := look(ctx, s, active)
		if err != nil {
			return err
		}
		if failing == "" {
			return nil
		}
		// A look the timeout cut short says only "killed"; the one before
		// it says what was wrong.
		if ctx.Err() == nil || last == "" {
			last = failing
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("health check: after %s %s", s.Timeout, last)
		case <-time.After(every):
		}
	}
}

// look checks once; it returns what is failing, "" when nothing is.
func look(ctx context.Context, s Spec, active ActiveFunc) (string, error) {
	var down []string
	for _, u := range s.Units {
		ok, err := active(ctx, u)
		if err != nil && ctx.Err() == nil {
			return "", err
		}
		if !ok {
			down = append(down, u)
		}
	}
	if len(down) > 0 {
		return "not active: " + strings.Join(down, ", "), nil
	}
	if len(s.Command) == 0 {
		return "", nil
	}
	out, err := exec.CommandContext(ctx, s.Command[0], s.Command[1:]...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:] // its last line says most
		}
		// A command the timeout killed has no exit status (ExitCode -1);
		// the ctx check also keeps one that happened to exit with the code
		// while being cut short from being read as a verdict.
		var exit *exec.ExitError
		if s.UnhealthyExitCode > 0 && errors.As(err, &exit) && exit.ExitCode() == s.UnhealthyExitCode && ctx.Err() == nil {
			return "", fmt.Errorf("health check: command %s said %w (exit status %d): %s", strings.Join(s.Command, " "), ErrUnhealthy, s.UnhealthyExitCode, msg)
		}
		return fmt.Sprintf("command %s failed (%v): %s", strings.Join(s.Command, " "), err, msg), nil
	}
	return "", nil
}
