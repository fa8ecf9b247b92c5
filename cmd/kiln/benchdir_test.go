//go:build !nodeonly

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// benchDir is the setup the bundle and import benchmarks share: a work
// directory on a real disk (not tmpfs) holding a base disk and a signing key
// (k.key, k.pub), and the environment kiln runs in there (its blob cache
// inside). It is removed when the benchmark ends, unless KILN_BENCH_KEEP is
// set (to time the inputs by hand).
type benchDir struct {
	dir string
	env []string
}

// benchBySize runs bench once per size of KILN_BENCH_SIZES (MiB), else of
// def, as sub-benchmarks named by size; bench gets the size in bytes.
func benchBySize(b *testing.B, bench func(b *testing.B, total int64), def ...int64) {
	for _, mib := range benchSizes(b, def...) {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) { bench(b, mib<<20) })
	}
}

func newBenchDir(b *testing.B, prefix string) *benchDir {
	b.Helper()
	dir, err := os.MkdirTemp("/var/tmp", prefix)
	if err != nil {
		b.Fatal(err)
	}
	if os.Getenv("KILN_BENCH_KEEP") == "" {
		b.Cleanup(func() { os.RemoveAll(dir) })
	} else {
		b.Logf("keeping %s (KILN_BENCH_KEEP)", dir)
	}
	if err := basedisk.Write(filepath.Join(dir, "base.raw")); err != nil {
		b.Fatal(err)
	}
	d := &benchDir{dir: dir, env: append(os.Environ(), "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))}
	d.kiln(b, []string{"key", "generate", d.path("k")})
	return d
}

func (d *benchDir) path(name string) string { return filepath.Join(d.dir, name) }

// benchImage is a recipe's image: its name, and where it comes from (a ref
// in one of the work directory's OCI layouts).
type benchImage struct{ name, layout, ref string }

// recipe writes VERSION/bench.yaml: appliance "bench" at version, on the
// base disk, trusting k.pub, with imgs; it returns its path.
func (d *benchDir) recipe(b *testing.B, version string, imgs []benchImage) string {
	b.Helper()
	text := fmt.Sprintf("apiVersion: kiln.dev/v1alpha1\nkind: Appliance\nname: bench\nversion: %s\nbase:\n  path: ../base.raw\ntrust: [../k.pub]\nimages:\n", version)
	for _, img := range imgs {
		text += fmt.Sprintf("  - name: %s\n    source: oci:../%s:%s\n", img.name, img.layout, img.ref)
	}
	p := filepath.Join(d.dir, version, "bench.yaml")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

// kiln runs each kiln command in turn, untimed; the first to fail ends the
// benchmark with its output.
func (d *benchDir) kiln(b *testing.B, runs ...[]string) {
	b.Helper()
	for _, args := range runs {
		if out, err := command(d.env, kilnBin, args...).CombinedOutput(); err != nil {
			b.Fatalf("kiln %v: %v\n%s", args, err, out)
		}
	}
}
