package seal

import "testing"

// SealAs makes Write seal as version until the test ends: the tests build
// the disks an older kiln wrote. A test that calls it cannot run in
// parallel with one that writes disks.
func SealAs(t *testing.T, version int) {
	t.Cleanup(func() { writeVersion = Version })
	writeVersion = version
}
