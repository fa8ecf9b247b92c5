package partitions

import (
	"io"
	"path/filepath"
	"testing"
)

// BenchmarkOpenBase measures streaming decompression of the fixture base
// (450 MiB, mostly zeros) by format.
func BenchmarkOpenBase(b *testing.B) {
	t := &testing.T{}
	dir := bases(t)
	for _, name := range []string{"base.raw", "base.raw.gz", "base.raw.xz", "base.raw.zst"} {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r, err := OpenBase(filepath.Join(dir, name), "")
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
