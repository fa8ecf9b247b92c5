package firstboot

import (
	"os"
	"testing"

	"go.podman.io/storage/pkg/reexec"
)

// containers/storage applies layers in a re-executed child of the test binary.
func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	os.Exit(m.Run())
}
