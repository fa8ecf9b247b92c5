//go:build !nodeonly

package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/bundle"
	"github.com/kiln-appliance/kiln/builder/reflashstick"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
	"github.com/kiln-appliance/kiln/test/golden"
)

// What kiln inspect prints of a bundle and of a reflash stick, text and
// JSON, for fixed reports (the black-box tests check real ones line by line).
func TestInspectGolden(t *testing.T) {
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	kiln := version.Info{Version: "v1.4.0", Commit: "0123456789abcdef0123456789abcdef01234567", Go: "go1.26.8", Edition: version.Factory}
	agent := version.Info{Version: "v1.4.0", Commit: kiln.Commit, Go: "go1.26.8", Edition: version.Node}
	delta := &bundle.Report{
		Path: "upgrade-1.1.img", Format: bundle.FormatImage, Size: 12 << 20, Offset: 1 << 20, Header: 8192,
		SignedBy: []string{"SHA256:factorykey"},
		Manifest: &bundlefmt.Manifest{
			SchemaVersion: bundlefmt.NoOSSchemaVersion, Recipe: "acme", Version: "1.1.0", Arch: "amd64", LockDigest: d("1"), Created: 315532800,
			Kiln: kiln, Kind: bundlefmt.KindDelta, AppliesTo: []contract.ReleaseID{{Version: "1.0.0", LockDigest: d("2")}},
			Images: []bundlefmt.Image{
				{Image: contract.Image{Name: "quay.io/acme/app:1.1", Digest: d("a"), Size: 600 << 10, Served: true, Preloaded: true, ImageID: d("b")}, Blobs: []string{d("b"), d("c")}},
				{Image: contract.Image{Name: "quay.io/acme/base:1", Digest: d("d"), Size: 300 << 10, Served: true, ImageID: d("e")}, Blobs: []string{d("e"), d("f")}},
			},
			Blobs: []bundlefmt.Blob{
				{Digest: d("a"), Size: 500, OnStick: true}, {Digest: d("b"), Size: 300, OnStick: true},
				{Digest: d("c"), Size: 600 << 10, OnStick: true, Unpacked: 1 << 20},
				{Digest: d("d"), Size: 500}, {Digest: d("e"), Size: 300}, {Digest: d("f"), Size: 300 << 10},
			},
			Space:        bundlefmt.Space{CopyBytes: 600<<10 + 800, UnpackedBytes: 1 << 20},
			ReleaseFiles: []contract.ReleaseFile{{Path: "/etc/containers/systemd/app.container", Mode: 0o644, Size: 40, Digest: d("9")}},
			Agent:        bundlefmt.File{Path: bundlefmt.AgentBinary, Size: 11 << 20, Digest: d("7"), Offset: 4096},
			AgentOnStick: true, AgentVersion: agent,
			Trust:      []contract.TrustKey{{KeyID: "SHA256:factorykey", PublicKey: "-----BEGIN PUBLIC KEY-----\n…\n-----END PUBLIC KEY-----\n"}},
			Filesystem: bundlefmt.Filesystem{Size: 11<<20 + 1<<20, Metadata: d("6")},
		},
	}
	// The same delta as a schema 1 bundle (for nodes of an older kiln), the
	// agent left off: the manifest says neither which kiln nor which agent.
	old := *delta
	oldManifest := *delta.Manifest
	oldManifest.SchemaVersion, oldManifest.Kiln, oldManifest.AgentVersion, oldManifest.AgentOnStick = 1, version.Info{}, version.Info{}, false
	old.Manifest, old.Format, old.Size = &oldManifest, bundle.FormatFile, 700<<10

	// The same delta of a release whose OS is in A/B slots: its slot
	// changed (a pack), its kernel did not.
	withOS := *delta
	osManifest := *delta.Manifest
	osManifest.SchemaVersion = bundlefmt.OSSchemaVersion
	osManifest.OS = &bundlefmt.OS{
		Usr: bundlefmt.UsrSlot{
			Index: d("3"), Size: 180 << 20,
			Verity: slot.Verity{RootHash: strings.Repeat("3f2a9c1b", 8), Salt: "6b696c6e", UUID: "6b696c6e-736c-6f74-8000-000000000001", DataBlocks: 180 << 8},
			Pack:   &bundlefmt.PackFile{Digest: d("4"), Size: 12<<20 + 300<<10},
			Bases:  []bundlefmt.SlotBase{{ReleaseID: delta.Manifest.AppliesTo[0], Index: d("5")}},
		},
		Entry: bundlefmt.BootEntry{
			Title: "Acme appliance", Version: "1.1", Options: []string{"root=LABEL=root", "rw", "console=ttyS0"}, UsrFSType: "squashfs",
			Kernel: bundlefmt.BootFile{Name: "vmlinuz", Size: 8 << 20, Digest: d("8")},
			Initrd: []bundlefmt.BootFile{{Name: "initrd.img", Size: 31 << 20, Digest: d("9"), OnStick: true}},
		},
	}
	withOS.Manifest = &osManifest

	stick := &reflashstick.Report{
		Path: "reflash.img",
		Layout: &gpt.Layout{Size: 1 << 30, SectorSize: 512, GUID: "0A1B2C3D-0000-4000-8000-000000000001", Partitions: []gpt.Partition{
			{Number: 1, Name: "root", Type: "0FC63DAF-8483-4772-8E79-3D69D8477DE4", GUID: "0A1B2C3D-0001-4000-8000-000000000001", FirstLBA: 2048, LastLBA: 526335, Offset: 1 << 20, Size: 256 << 20, Filesystem: "ext4", Label: "root"},
			{Number: 2, Name: recovery.PartitionName, Type: recovery.PartitionType, GUID: "0A1B2C3D-0002-4000-8000-000000000001", FirstLBA: 526336, LastLBA: 1574911, Offset: 257 << 20, Size: 512 << 20, Filesystem: "squashfs"},
		}},
		Disk: reflashstick.Disk{Size: 480 << 20, SHA256: d("4"), DiskGUID: "5E5E5E5E-0000-4000-8000-000000000001", Contents: &contract.Contents{
			SchemaVersion: contract.ContentsVersion, Recipe: "acme", Version: "1.0.0", Arch: "amd64", LockDigest: d("2"), Created: 315532800, Kiln: kiln,
			Images:   []contract.Image{{Name: "quay.io/acme/app:1.0", Digest: d("a"), MediaType: "application/vnd.oci.image.manifest.v1+json", Size: 600 << 10, Served: true, Preloaded: true, ImageID: d("b")}},
			Files:    []contract.File{{Path: "bin/kiln", Size: 11 << 20, Digest: d("7")}},
			Registry: contract.Registry{Listen: "127.0.0.1:5050", MirrorTags: true, Upstreams: []string{"quay.io"}},
		}},
		Target: recovery.Target{Path: "/dev/disk/by-path/pci-0000:00:1f.2-ata-1", MinSize: 64 << 30},
		Agent:  reflashstick.Agent{Size: 11 << 20, Digest: d("7"), Version: &agent},
		Kiln:   &kiln,
	}
	// A stick made before kiln recorded what it carries.
	bare := *stick
	bare.Disk.Contents, bare.Agent.Version, bare.Kiln, bare.Target, bare.Unattended = nil, nil, nil, recovery.Target{}, true

	// A base in A/B slots (the e2e fixture's layout), one whose slots are
	// refused, and a built disk of a base without slots.
	part := func(n int, name, typ, fs string, mib int64) gpt.Partition {
		guid := fmt.Sprintf("6B696C6E-6532-4500-8000-%012d", n)
		return gpt.Partition{Number: n, Name: name, Type: typ, GUID: guid, Offset: int64(n) << 20, Size: mib << 20, Filesystem: fs}
	}
	usr, usrVerity := contract.UsrPartTypes["amd64"], contract.UsrVerityPartTypes["amd64"]
	abLayout := &gpt.Layout{Size: 1 << 30, SectorSize: 512, GUID: "6B696C6E-6532-4500-8000-0000000000AB", Partitions: []gpt.Partition{
		part(1, "EFI-SYSTEM", "C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "vfat", 128), part(2, "boot", "0FC63DAF-8483-4772-8E79-3D69D8477DE4", "ext4", 64),
		part(3, "usr-a", usr, "squashfs", 272), part(4, "usr-a-verity", usrVerity, "", 6),
		part(5, "usr-b", usr, "", 272), part(6, "usr-b-verity", usrVerity, "", 6), part(7, "root", "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709", "ext4", 256),
	}}
	slotPart := func(p gpt.Partition) contract.SlotPartition {
		return contract.SlotPartition{Name: p.Name, PartUUID: strings.ToLower(p.GUID), Size: p.Size}
	}
	ps := abLayout.Partitions
	abBase := &builder.Report{Disk: "ab-base.raw", Layout: abLayout, OSSlots: &contract.OSSlots{
		Arch: "amd64", Active: contract.SlotA, Entry: "kiln-1.0", RootHash: strings.Repeat("b2e4228c", 8),
		Slots: [2]contract.OSSlot{{Name: contract.SlotA, Usr: slotPart(ps[2]), UsrVerity: slotPart(ps[3])}, {Name: contract.SlotB, Usr: slotPart(ps[4]), UsrVerity: slotPart(ps[5])}},
	}}
	refused := &builder.Report{Disk: "ab-base-3.raw", Layout: abLayout,
		OSSlotsError: `the base has 3 usr partitions (3 "usr-a", 5 "usr-b", 8 "usr-c"), where A/B slots are two: give it two (B no smaller than A), or none (no OS upgrades)`}
	plain := &builder.Report{Disk: "disk.raw", Layout: stick.Layout, Contents: stick.Disk.Contents, Sizes: map[string]int64{"bin": 11 << 20},
		ReleaseFiles: delta.Manifest.ReleaseFiles, Trust: delta.Manifest.Trust}
	// A disk whose recipe trusts no key: no bundle is accepted.
	untrusting := *plain
	untrusting.ReleaseFiles, untrusting.Trust = nil, nil

	for name, print := range map[string]func(*bytes.Buffer, string) error{
		"disk-ab-base":          func(w *bytes.Buffer, f string) error { return printDisk(w, abBase, f) },
		"disk-ab-base-refused":  func(w *bytes.Buffer, f string) error { return printDisk(w, refused, f) },
		"disk-no-slots":         func(w *bytes.Buffer, f string) error { return printDisk(w, plain, f) },
		"disk-no-trust":         func(w *bytes.Buffer, f string) error { return printDisk(w, &untrusting, f) },
		"bundle-delta":          func(w *bytes.Buffer, f string) error { return printBundle(w, delta, f) },
		"bundle-schema1":        func(w *bytes.Buffer, f string) error { return printBundle(w, &old, f) },
		"bundle-os":             func(w *bytes.Buffer, f string) error { return printBundle(w, &withOS, f) },
		"reflash-stick":         func(w *bytes.Buffer, f string) error { return printReflashStick(w, stick, f) },
		"reflash-stick-unnamed": func(w *bytes.Buffer, f string) error { return printReflashStick(w, &bare, f) },
	} {
		for _, format := range []string{"text", "json"} {
			var w bytes.Buffer
			if err := print(&w, format); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, filepath.Join("testdata", "inspect-"+name+"."+format+".golden"), w.Bytes())
		}
	}
}
