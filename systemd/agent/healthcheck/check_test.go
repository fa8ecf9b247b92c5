package healthcheck

import (
	"context"
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
