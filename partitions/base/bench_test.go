package base

import (
	"io"
	"testing"

	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
)

// BenchmarkOpenBase measures streaming decompression of the fixture base
// (450 MiB, mostly zeros) by format.
func BenchmarkOpenBase(b *testing.B) {
	for _, base := range []struct{ name, path string }{
		{"base.raw", fixtures.Base(b)},
		{"base.raw.gz", fixtures.Compressed(b, "gzip")},
		{"base.raw.xz", fixtures.Compressed(b, "xz")},
		{"base.raw.zst", fixtures.Compressed(b, "zstd")},
	} {
		b.Run(base.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r, err := Open(base.path, "")
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, r)
				if err != nil {
					b.Fatal(err)
				}
				r.Close()
				b.SetBytes(n)
			}
		})
	}
}
