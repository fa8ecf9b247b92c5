// Package crio checks kiln's node-side files with CRI-O's own code, and holds
// the CRI client the e2e appliance runs (cmd/cri-check).
//
// It is its own Go module: CRI-O v1.34 brings the frozen
// github.com/containers/{image,storage} modules and a Kubernetes dependency
// tree that kiln's main module must not carry. `make test` runs it.
package crio
