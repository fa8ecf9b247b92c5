// Command demo generates the inputs of recipes/demo.yaml (release 1.0) and
// recipes/demo-1.1.yaml (its upgrade) with no network: a small CoreOS-like
// base disk and an OCI layout of a tiny static Go program under each image
// name, all made by code in this repository.
//
//	go run ./test/demo out/demo
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
)

// Images of the demo recipe: one served by the node's registry and preloaded,
// one served only (pulled through the mirror), one preloaded only.
var demoImages = []string{
	"quay.io/kiln-demo/hello:1.0",
	"registry.example.com/kiln-demo/hello-served:1.0",
	"quay.io/kiln-demo/hello-preloaded:1.0",
}

// Release 1.1 of the demo ships hello:1.1: hello:1.0's layer and one more,
// as a new build of an image adds a layer to the ones it shares.
const (
	demoUpgrade      = "quay.io/kiln-demo/hello:1.1"
	demoReleaseFile  = "etc/hello-release"
	demoReleaseLabel = "kiln-demo hello 1.1\n"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./test/demo OUTDIR")
		os.Exit(2)
	}
	if err := generate(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func generate(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(dir, "base.raw")
	if _, err := os.Stat(base); err != nil {
		if err := basedisk.Write(base); err != nil {
			return fmt.Errorf("base disk: %w", err)
		}
	}
	layout := filepath.Join(dir, "oci")
	if err := os.RemoveAll(layout); err != nil {
		return err
	}
	for _, ref := range demoImages {
		if _, err := images.HelloImage(layout, ref, "amd64", "arm64"); err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
	}
	if _, err := images.HelloImageWith(layout, demoUpgrade, map[string]string{demoReleaseFile: demoReleaseLabel}, "amd64", "arm64"); err != nil {
		return fmt.Errorf("image %s: %w", demoUpgrade, err)
	}
	fmt.Printf("demo inputs in %s: base.raw, oci/ (%d images)\n", dir, len(demoImages)+1)
	return nil
}
