package contract

import "testing"

func TestParseReference(t *testing.T) {
	t.Parallel()
	const d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		in, repo, tag, digest, str string
	}{
		{"busybox", "docker.io/library/busybox", "", "", "docker.io/library/busybox"},
		{"busybox:1.36", "docker.io/library/busybox", "1.36", "", "docker.io/library/busybox:1.36"},
		{"docker.io/busybox:1.36", "docker.io/library/busybox", "1.36", "", "docker.io/library/busybox:1.36"},
		{"index.docker.io/library/busybox:1", "docker.io/library/busybox", "1", "", "docker.io/library/busybox:1"},
		{"acme/app:2", "docker.io/acme/app", "2", "", "docker.io/acme/app:2"},
		{"quay.io/acme/app:1.2", "quay.io/acme/app", "1.2", "", "quay.io/acme/app:1.2"},
		{"localhost:5000/app@" + d, "localhost:5000/app", "", d, "localhost:5000/app@" + d},
		{"quay.io/acme/app:1.2@" + d, "quay.io/acme/app", "1.2", d, "quay.io/acme/app:1.2@" + d},
	}
	for _, tt := range tests {
		r, err := ParseReference(tt.in)
		if err != nil {
			t.Errorf("ParseReference(%q): %v", tt.in, err)
			continue
		}
		if r.Repository() != tt.repo || r.Tag != tt.tag || r.Digest != tt.digest || r.String() != tt.str {
			t.Errorf("ParseReference(%q) = %+v (%s), want repo %s tag %q digest %q string %s", tt.in, r, r.String(), tt.repo, tt.tag, tt.digest, tt.str)
		}
	}
	for _, bad := range []string{"", "UPPER/app", "quay.io/acme/app:", "a b", "quay.io/app@sha256:12"} {
		if _, err := ParseReference(bad); err == nil {
			t.Errorf("ParseReference(%q): no error", bad)
		}
	}
}

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{DefaultListen, "127.0.0.2:5050", "[::1]:6000", "127.0.0.1:65535"} {
		if err := CheckListen(ok); err != nil {
			t.Errorf("CheckListen(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.1:5050", "0.0.0.0:5050", "[::]:5050", "localhost:5050", "127.0.0.1:80", "127.0.0.1:0", "127.0.0.1", "127.0.0.1:x"} {
		if err := CheckListen(bad); err == nil {
			t.Errorf("CheckListen(%q): no error", bad)
		}
	}
}
