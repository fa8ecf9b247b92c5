package healthcheck

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	activeAfter := func(n int) ActiveFunc {
		calls := 0
		return func(ctx context.Context, unit string) (bool, error) {
			calls++
			return unit != "app.service" || calls > n, nil
		}
	}
	for _, c := range []struct {
		name   string
		spec   Spec
		active ActiveFunc
		want   string // "" = healthy
	}{
		{"units active", Spec{Units: []string{"crio.service", "app.service"}}, activeAfter(0), ""},
		{"unit comes up within the timeout", Spec{Units: []string{"app.service"}}, activeAfter(3), ""},
		{"unit never comes up", Spec{Units: []string{"crio.service", "app.service"}}, activeAfter(1 << 30), "not active: app.service"},
		{"command succeeds", Spec{Command: []string{"true"}}, nil, ""},
		{"command fails", Spec{Command: []string{"sh", "-c", "echo starting; echo db unreachable; exit 3"}}, nil, "command sh -c echo starting; echo db unreachable; exit 3 failed (exit status 3): db unreachable"},
		{"command missing", Spec{Command: []string{"/nonexistent/check"}}, nil, "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// The timeout is long enough for the command to run to its end
			// at least once on a loaded CI machine.
			c.spec.Timeout, c.spec.Every = 3*time.Second, 10*time.Millisecond
			err := Run(context.Background(), c.spec, c.active)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("healthy, got %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// A look the timeout cuts short must not hide what the looks before it found.
func TestRunReportsLastCompleteLook(t *testing.T) {
	marker := t.TempDir() + "/ran"
	script := "if [ -e " + marker + " ]; then exec sleep 30; fi; touch " + marker + "; echo db unreachable; exit 3"
	s := Spec{Command: []string{"sh", "-c", script}, Timeout: time.Second, Every: 10 * time.Millisecond}
	err := Run(context.Background(), s, nil)
	if err == nil || !strings.Contains(err.Error(), "(exit status 3): db unreachable") {
		t.Fatalf("got %v, want the first look's failure", err)
	}
}

// The recipe's unhealthyExitCode ends the check at once; every other
// failure still waits for the timeout.
func TestRunUnhealthyExitCode(t *testing.T) {
	counter := func(fails int) string { // fails fails times with exit 1, then succeeds
		n := t.TempDir() + "/n"
		return "echo x >> " + n + "; [ $(wc -l < " + n + ") -gt " + strconv.Itoa(fails) + " ] || { echo not yet; exit 1; }"
	}
	const long = time.Minute
	for _, c := range []struct {
		name      string
		command   []string
		code      int
		timeout   time.Duration
		want      string // "" = healthy; else the error, exactly
		unhealthy bool   // errors.Is ErrUnhealthy, long before the timeout
	}{
		{"the code: unhealthy at once", []string{"sh", "-c", "echo pulling; echo image gone; exit 3"}, 3, long,
			"health check: command sh -c echo pulling; echo image gone; exit 3 said unhealthy (exit status 3): image gone", true},
		{"another failure waits for the timeout", []string{"sh", "-c", "echo starting; exit 1"}, 3, time.Second,
			"health check: after 1s command sh -c echo starting; exit 1 failed (exit status 1): starting", false},
		{"success after a few failures", []string{"sh", "-c", counter(3)}, 3, long, "", false},
		{"no code: exit 3 is not yet healthy", []string{"sh", "-c", "echo image gone; exit 3"}, 0, time.Second,
			"health check: after 1s command sh -c echo image gone; exit 3 failed (exit status 3): image gone", false},
		// Killed, the command has no exit status: not even a code of 137,
		// how a shell reports a child killed by SIGKILL, is read into it.
		{"killed by the timeout", []string{"sleep", "30"}, 137, time.Second,
			"health check: after 1s command sleep 30 failed (signal: killed): ", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := Spec{Command: c.command, UnhealthyExitCode: c.code, Timeout: c.timeout, Every: 10 * time.Millisecond}
			start := time.Now()
			err := Run(context.Background(), s, nil)
			took := time.Since(start)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("healthy, got %v", err)
			case c.want != "" && (err == nil || err.Error() != c.want):
				t.Fatalf("got %v, want %q", err, c.want)
			case errors.Is(err, ErrUnhealthy) != c.unhealthy:
				t.Errorf("errors.Is(%v, ErrUnhealthy) = %v, want %v", err, !c.unhealthy, c.unhealthy)
			}
			// Generous bounds: a loaded machine is slow, never early.
			if c.unhealthy && took > c.timeout/4 {
				t.Errorf("took %s of a %s timeout: the check did not stop at the unhealthy code", took, c.timeout)
			}
			if !c.unhealthy && c.want != "" && took < c.timeout {
				t.Errorf("gave up after %s, before the %s timeout", took, c.timeout)
			}
		})
	}
}
