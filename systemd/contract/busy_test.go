package contract

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckBusy(t *testing.T) {
	r := &ReleaseID{Version: "1.1.0"}
	for _, tc := range []struct {
		name           string
		staged, trying *ReleaseID
		want           string // "" for nil
	}{
		{"idle", nil, nil, ""},
		{"staged", r, nil, "release 1.1.0 is staged and not yet tried; reboot the appliance to try it (or drop it: kiln agent release abandon 1.1.0), then import 1.2.0"},
		{"trying", nil, r, "release 1.1.0 is being tried; wait until its health check confirms it or rolls it back (kiln agent status), then import 1.2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckBusy(tc.staged, tc.trying, "1.2.0")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrBusy) || !strings.HasSuffix(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrBusy ending %q", err, tc.want)
			}
		})
	}
}
