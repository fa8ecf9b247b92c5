package bundle

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
)

// abBase writes an A/B base whose slot a holds a real OS: /usr of files
// (version's own file, and a large one every version shares), the kernel
// and an initramfs.
func abBase(t *testing.T, dir, version string, kernel, initrd []byte) string {
	t.Helper()
	p := filepath.Join(dir, "ab-"+version+".raw")
	shared := make([]byte, 2<<20) // incompressible, and the same in every release
	rand.New(rand.NewSource(1)).Read(shared)
	o := basedisk.OS{Version: version, Kernel: kernel, Initrd: initrd, Usr: map[string][]byte{
		"lib/shared.bin": shared,
		"lib/os-release": []byte("VERSION=" + version + "\n"),
	}}
	if err := basedisk.Write(p, basedisk.WithABSlotsOS(8<<20, 8<<20, o)); err != nil {
		t.Fatal(err)
	}
	return p
}

// A recipe on an A/B base brings its OS: the slot's index, verity values
// and pack, and the boot entry's files. A delta from a release carries only
// the chunks and boot files that release's nodes lack.
func TestOSBundles(t *testing.T) {
	rs := newReleases(t)
	kernel := bytes.Repeat([]byte("kernel "), 4096)
	r10 := rs.recipeOn(t, abBase(t, rs.dir, "1.0", kernel, []byte("initrd 1.0")), "acme", "1.0.0", "")
	r11 := rs.recipeOn(t, abBase(t, rs.dir, "1.1", kernel, []byte("initrd 1.1")), "acme", "1.1.0", "")
	b10 := filepath.Join(rs.dir, "upgrade-1.0.img")
	full := rs.write(t, r10, b10).Manifest
	b11 := filepath.Join(rs.dir, "upgrade-1.1.img")
	delta := rs.write(t, r11, b11, from(b10)).Manifest

	for _, m := range []*bundlefmt.Manifest{full, delta} {
		if m.SchemaVersion != bundlefmt.OSSchemaVersion || m.OS == nil {
			t.Fatalf("%s: schema %d, OS %v", m.Version, m.SchemaVersion, m.OS)
		}
	}
	f := full.OS
	if f.Usr.Pack == nil || f.Usr.Pack.Size < f.Usr.Size/2 || len(f.Usr.Bases) != 0 {
		t.Errorf("full: pack %+v for a %d-byte slot, bases %v: want every chunk", f.Usr.Pack, f.Usr.Size, f.Usr.Bases)
	}
	if !f.Entry.Kernel.OnStick || len(f.Entry.Initrd) != 1 || !f.Entry.Initrd[0].OnStick || f.Entry.Version != "1.0" || f.Entry.UsrFSType != "squashfs" {
		t.Errorf("full: entry %+v", f.Entry)
	}
	for _, o := range f.Entry.Options {
		if bundlefmt.IsUsrVerityOption(o) {
			t.Errorf("the entry's options keep %q, which the node writes for its slot", o)
		}
	}
	d := delta.OS
	if len(d.Usr.Bases) != 1 || d.Usr.Bases[0].Index != f.Usr.Index || d.Usr.Bases[0].Version != "1.0.0" {
		t.Errorf("delta: bases %+v, want 1.0.0's slot index %s", d.Usr.Bases, f.Usr.Index)
	}
	if d.Usr.Pack == nil || d.Usr.Pack.Size >= f.Usr.Pack.Size/2 {
		t.Errorf("delta: pack %+v, the full one %d bytes: the shared chunks must stay out", d.Usr.Pack, f.Usr.Pack.Size)
	}
	if d.Usr.Verity.RootHash == f.Usr.Verity.RootHash {
		t.Error("1.1's slot has 1.0's root hash")
	}
	if d.Entry.Kernel.OnStick || d.Entry.Kernel.Digest != f.Entry.Kernel.Digest {
		t.Errorf("delta: kernel %+v: 1.0's nodes boot this one already", d.Entry.Kernel)
	}
	if !d.Entry.Initrd[0].OnStick {
		t.Errorf("delta: initrd %+v: 1.0's nodes lack it", d.Entry.Initrd[0])
	}
	for _, p := range []string{b10, b11} {
		if _, err := Verify(context.Background(), p, []ed25519.PublicKey{rs.pub}, nil); err != nil {
			t.Errorf("Verify: %v", err)
		}
	}
	// The OS files are in the filesystem by digest; the kernel the delta
	// leaves out is not.
	listed := map[string]bool{}
	for _, file := range delta.Files {
		listed[file.Path] = true
	}
	for _, want := range []struct {
		d  string
		in bool
	}{{d.Usr.Index, true}, {f.Usr.Index, true}, {d.Usr.Pack.Digest, true}, {d.Entry.Initrd[0].Digest, true}, {d.Entry.Kernel.Digest, false}} {
		if listed[bundlefmt.OSFile(want.d)] != want.in {
			t.Errorf("delta: %s in the filesystem: %v, want %v", bundlefmt.OSFile(want.d), !want.in, want.in)
		}
	}
}

func TestOSRefuses(t *testing.T) {
	rs := newReleases(t)
	ab := abBase(t, rs.dir, "1.0", []byte("kernel"), []byte("initrd"))
	r10 := rs.recipeOn(t, ab, "acme", "1.0.0", "")
	// Pinned to another base's digest.
	b, _ := os.ReadFile(r10)
	pinned := rs.recipeOn(t, ab, "acme", "1.0.1", "")
	os.WriteFile(pinned, bytes.Replace(b, []byte("  path: "+ab), []byte("  path: "+ab+"\n  digest: sha256:"+strings.Repeat("0", 64)), 1), 0o644)
	// A disk of 0.9, built on a base without slots.
	r09 := rs.recipe(t, "acme", "0.9.0", "")
	disk09 := filepath.Join(rs.dir, "disk-0.9.raw")
	if _, err := builder.Build(context.Background(), r09, builder.Options{Output: disk09, CacheDir: rs.cache, Agent: agentBin}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, recipe string
		opt          func(*Options)
		want         string
	}{
		{"the base is not the pinned one", pinned, nil, "but the recipe expects sha256:" + strings.Repeat("0", 64) + "; use the right file or fix base.digest"},
		{"--from nodes without slots", r10, from(disk09), "--from " + disk09 + ": its nodes have no OS slots (their base had none), so they cannot take the OS of acme 1.0.0: reflash them with it (kiln reflash-stick)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "upgrade.img")
			o := rs.options(out)
			if tc.opt != nil {
				tc.opt(&o)
			}
			if _, err := Write(context.Background(), tc.recipe, o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write = %v, want an error containing %q", err, tc.want)
			}
			noOutput(t, out)
		})
	}
}
