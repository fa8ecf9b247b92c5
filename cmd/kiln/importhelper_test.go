package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"syscall"

	"github.com/kiln-appliance/kiln/systemd/agent/bundleimport"
	"github.com/kiln-appliance/kiln/systemd/agent/release"
)

// The crash helper: the test binary, re-executed, imports a bundle as
// `kiln agent import` does and kills itself (SIGKILL: a power cut, as far
// as the node's files can tell) at a named step of the OS install or of
// the state machine.
const importHelperEnv = "KILN_IMPORT_TEST_HELPER"

type importHelperJob struct {
	Root, Bundle, DieAt string
}

// importHelper runs the job in importHelperEnv, if any (from TestMain).
func importHelper() bool {
	job := os.Getenv(importHelperEnv)
	if job == "" {
		return false
	}
	var j importHelperJob
	if err := json.Unmarshal([]byte(job), &j); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	seen := map[string]int{}
	step := func(s string) {
		seen[s]++
		name := fmt.Sprintf("%s#%d", s, seen[s])
		fmt.Println("STEP " + name)
		if name == j.DieAt {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	m := release.New(release.WithRoot(j.Root), release.WithLog(os.Stdout),
		release.WithPinApplier(release.PinApplierFunc(func(context.Context) error { return nil })), release.WithStepHook(step))
	_, err := bundleimport.Import(context.Background(), j.Bundle, bundleimport.WithRoot(j.Root), bundleimport.WithMachine(m),
		bundleimport.WithOSStepHook(step), bundleimport.WithOSJobs(1), bundleimport.WithImageStore((&releaseFlags{root: j.Root}).openStore))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}
