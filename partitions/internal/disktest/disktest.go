// Package disktest assembles the kiln disks the tests of partitions and
// of its readers (seal, squashfs, verity) check, with partitions.Assemble
// itself: the disk a build writes, never a hand-made imitation.
package disktest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Disk is the tests' disk of tree: the fixture base, the image partition
// at its end with 10 % headroom, Epoch, a fixed seed.
func Disk(t testing.TB, tree string) partitions.Disk {
	return partitions.Disk{
		Base:            partitions.Base{Path: fixtures.Base(t)},
		Geometry:        partitions.Geometry{Headroom: 10, Placement: partitions.PlaceEnd},
		Image:           partitions.Image{Tree: tree},
		SourceDateEpoch: fixtures.Epoch,
		GUIDSeed:        []byte("acme-edge 1.4.0"),
	}
}

// Ignition writes fixtures.Ignition whatever the identity (the default of
// Assemble and Try); WithIgnition(nil) after it writes none.
var Ignition = partitions.WithIgnition(func(partitions.ImageIdentity) ([]byte, error) { return fixtures.Ignition, nil })

// Assemble assembles d into a new file and returns it and its layout,
// failing the test on an error.
func Assemble(t testing.TB, d partitions.Disk, opts ...partitions.Option) (string, *gpt.Layout) {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "disk-*.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	l, err := partitions.Assemble(context.Background(), out, d, append([]partitions.Option{Ignition}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out.Name(), l
}

// Try assembles d into a new file and returns Assemble's error.
func Try(t testing.TB, d partitions.Disk, opts ...partitions.Option) error {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "disk-*.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	_, err = partitions.Assemble(context.Background(), out, d, append([]partitions.Option{Ignition}, opts...)...)
	return err
}

// Contents is a kiln.json as the builder writes it.
var Contents = contract.Contents{
	SchemaVersion: contract.ContentsVersion, Recipe: "acme-edge", Version: "1.4.0", Arch: "amd64",
	LockDigest: "sha256:" + strings.Repeat("1", 64), Created: fixtures.Epoch,
	Images: []contract.Image{{Name: "quay.io/acme/app:1.2", Digest: "sha256:" + strings.Repeat("a", 64),
		MediaType: "application/vnd.oci.image.manifest.v1+json", Size: 1234, Served: true, ImageID: "sha256:" + strings.Repeat("b", 64)}},
	Files:    []contract.File{{Path: "oci/index.json", Size: 2, Digest: "sha256:" + strings.Repeat("c", 64)}},
	Registry: contract.Registry{Listen: "127.0.0.1:5050", Upstreams: []string{"quay.io"}},
}

// Sealed builds a small kiln disk whose tree holds Contents as its
// kiln.json; it returns the disk and kiln.json's bytes.
func Sealed(t testing.TB, noVerity bool) (string, []byte) {
	t.Helper()
	tree := fixtures.StageTree(t)
	var js bytes.Buffer
	if err := Contents.Encode(&js); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, contract.ContentsFile), js.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	d := Disk(t, tree)
	d.Base.Path, d.Geometry.Placement, d.Image.NoVerity = fixtures.SmallBase(t), partitions.PlaceBeforeRoot, noVerity
	disk, _ := Assemble(t, d)
	return disk, js.Bytes()
}
