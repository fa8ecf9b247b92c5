package contract

import (
	"strings"
	"testing"
)

// The one rule for the registry's address: empty is the default, anything
// else must be a loopback IP and an unprivileged port.
func TestListenAddress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ addr, want, err string }{
		{"", DefaultListen, ""},
		{"127.0.0.1:5050", "127.0.0.1:5050", ""},
		{"[::1]:6000", "[::1]:6000", ""},
		{"127.0.0.1", "", "is not IP:PORT"},
		{"localhost:5050", "", "the host must be a loopback IP"},
		{"0.0.0.0:5050", "", "the host must be a loopback IP"},
		{"127.0.0.1:80", "", "the port must be 1024-65535"},
	} {
		got, err := ListenAddress(tc.addr)
		if tc.err == "" && (err != nil || got != tc.want) {
			t.Errorf("ListenAddress(%q) = %q, %v; want %q", tc.addr, got, err, tc.want)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ListenAddress(%q): %v, want an error with %q", tc.addr, err, tc.err)
		}
	}
}
