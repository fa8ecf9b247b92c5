package stage

import (
	"bytes"
	"io"
	"os"
	"syscall"
	"testing"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func nlink(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(fi.Sys().(*syscall.Stat_t).Nlink)
}
