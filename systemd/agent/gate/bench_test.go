package gate

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// BenchmarkCheck100 measures one full gate check (GET /v2/ + 100 HEADs by
// digest) against a real loopback registry: the gate's cost per attempt.
func BenchmarkCheck100(b *testing.B) {
	addr := serve(b, "127.0.0.1:0", registry.New(registry.Logger(nopLogger())))
	c := &contract.Contents{Registry: contract.Registry{Listen: addr}}
	for i := 0; i < 100; i++ {
		img, err := random.Image(256, 1)
		if err != nil {
			b.Fatal(err)
		}
		n := fmt.Sprintf("quay.io/acme/app%d:1", i)
		ref, _ := name.ParseReference(addr+"/"+n, name.Insecure)
		if err := remote.Write(ref, img); err != nil {
			b.Fatal(err)
		}
		d, _ := img.Digest()
		mt, _ := img.MediaType()
		c.Images = append(c.Images, contract.Image{Name: n, Digest: d.String(), MediaType: string(mt), Served: true})
	}
	g, err := New(c)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := g.Check(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
