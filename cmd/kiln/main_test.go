package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// On Ctrl-C the user reads "interrupted", never Go's "context canceled".
func TestErrorMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err         error
		interrupted bool
		want        string
	}{
		{context.Canceled, true, "interrupted"},
		{fmt.Errorf("image app: fetch blob sha256:ab: %w", context.Canceled), true, "image app: fetch blob sha256:ab: interrupted"},
		{errors.Join(errors.New("write image filesystem"), context.Canceled), true, "write image filesystem\ninterrupted"},
		{errors.New("mksquashfs: signal: interrupt"), true, "interrupted: mksquashfs: signal: interrupt"},
		{errors.New("copy: interrupted before the end"), true, "copy: interrupted before the end"},
		{errors.New("base image x: no GPT"), false, "base image x: no GPT"},
	} {
		if got := errorMessage(tc.err, tc.interrupted); got != tc.want {
			t.Errorf("errorMessage(%q, %v) = %q, want %q", tc.err, tc.interrupted, got, tc.want)
		}
	}
}
