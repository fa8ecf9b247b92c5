package vm

import "runtime"

// runtimeCaller locates this source file, to find the repository's
// test/e2e/.cache without depending on the working directory.
func runtimeCaller() (uintptr, string, int, bool) { return runtime.Caller(0) }
