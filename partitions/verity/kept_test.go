package verity_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/internal/disktest"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	"github.com/kiln-appliance/kiln/partitions/seal"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	. "github.com/kiln-appliance/kiln/partitions/verity"
)

func TestMain(m *testing.M) { fixtures.Main(m) }

// knownBlobs names the stage tree's blobs by their size and sha256, as the
// builder names blobs by their locked digests.
func knownBlobs(t testing.TB, tree string) map[string]squashfs.FileDigest {
	t.Helper()
	known := map[string]squashfs.FileDigest{}
	for _, name := range []string{"big", fmt.Sprintf("%064x", 7), fmt.Sprintf("%064x", 42)} {
		p := "oci/blobs/sha256/" + name
		data, err := os.ReadFile(filepath.Join(tree, p))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		known[p] = squashfs.FileDigest{Size: int64(len(data)), Digest: "sha256:" + hex.EncodeToString(sum[:])}
	}
	return known
}

// keyOf writes tree as the image filesystem and returns its tree key.
func keyOf(t *testing.T, o squashfs.Options, salt []byte, known map[string]squashfs.FileDigest) (string, error) {
	t.Helper()
	o.Disk = filepath.Join(t.TempDir(), "fs")
	n, err := squashfs.Write(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(o.Disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return KeyOf(f, n, salt, known)
}

// The kept tree's key changes with every input the tree depends on, and
// only with those: a change the key missed would put on a disk a tree that
// does not match its data, and the node could not mount its images.
func TestTreeKey(t *testing.T) {
	salt := []byte("salt")
	base := func(t *testing.T) (squashfs.Options, map[string]squashfs.FileDigest) {
		tree := fixtures.StageTree(t)
		return squashfs.Options{Tree: tree, SourceDateEpoch: fixtures.Epoch}, knownBlobs(t, tree)
	}
	o, known := base(t)
	want, err := keyOf(t, o, salt, known)
	if err != nil {
		t.Fatal(err)
	}
	write := func(t *testing.T, tree, p string, data []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(tree, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		change func(t *testing.T, o *squashfs.Options, known map[string]squashfs.FileDigest, salt *[]byte)
		same   bool
	}{
		{"nothing", func(*testing.T, *squashfs.Options, map[string]squashfs.FileDigest, *[]byte) {}, true},
		{"a byte of a file not known", func(t *testing.T, o *squashfs.Options, _ map[string]squashfs.FileDigest, _ *[]byte) {
			write(t, o.Tree, "storage/overlay/l1/diff/ping", []byte("#!/bin/sH\n"))
		}, false},
		{"a known file's digest", func(t *testing.T, _ *squashfs.Options, known map[string]squashfs.FileDigest, _ *[]byte) {
			d := known["oci/blobs/sha256/big"]
			d.Digest = "sha256:" + strings.Repeat("0", 64)
			known["oci/blobs/sha256/big"] = d
		}, false},
		{"a known file not known", func(_ *testing.T, _ *squashfs.Options, known map[string]squashfs.FileDigest, _ *[]byte) {
			delete(known, "oci/blobs/sha256/big")
		}, false},
		{"a known file moved by one before it", func(t *testing.T, o *squashfs.Options, _ map[string]squashfs.FileDigest, _ *[]byte) {
			write(t, o.Tree, "oci/blobs/sha256/a", make([]byte, 5000))
		}, false},
		{"a file's mode", func(_ *testing.T, o *squashfs.Options, _ map[string]squashfs.FileDigest, _ *[]byte) {
			o.Attrs = []squashfs.FileAttrs{{Path: "kiln.json", Mode: 0o600}}
		}, false},
		{"the time stamped on every file", func(_ *testing.T, o *squashfs.Options, _ map[string]squashfs.FileDigest, _ *[]byte) {
			o.SourceDateEpoch++
		}, false},
		{"the salt", func(_ *testing.T, _ *squashfs.Options, _ map[string]squashfs.FileDigest, salt *[]byte) {
			*salt = []byte("sal7")
		}, false},
		// What the key trusts: a known file's bytes stand for its digest.
		// (A cache that lied would give a disk whose tree does not match;
		// kiln verify finds it: TestKeptVerityTree.)
		{"a known file's bytes, its digest kept", func(t *testing.T, o *squashfs.Options, _ map[string]squashfs.FileDigest, _ *[]byte) {
			p := filepath.Join(o.Tree, "oci/blobs/sha256/big")
			data, _ := os.ReadFile(p)
			data[len(data)/2] ^= 1
			write(t, o.Tree, "oci/blobs/sha256/big", data)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, known := base(t)
			s := salt
			tt.change(t, &o, known, &s)
			got, err := keyOf(t, o, s, known)
			if err != nil {
				t.Fatal(err)
			}
			if (got == want) != tt.same {
				t.Errorf("key %s, unchanged one %s: want same=%v", got, want, tt.same)
			}
		})
	}

	// A known file listed with another size is read like the rest: the key
	// is the one without it.
	t.Run("a known file's size wrong", func(t *testing.T) {
		o, known := base(t)
		d := known["oci/blobs/sha256/big"]
		d.Size++
		known["oci/blobs/sha256/big"] = d
		got, _ := keyOf(t, o, salt, known)
		delete(known, "oci/blobs/sha256/big")
		without, _ := keyOf(t, o, salt, known)
		if got != without || got == want {
			t.Errorf("with a wrong size %s, without it %s, listed right %s", got, without, want)
		}
	})

	// No key (the tree is hashed) where the bytes cannot be named.
	for _, tt := range []struct {
		name, want string
		change     func(o *squashfs.Options, known map[string]squashfs.FileDigest)
	}{
		{"compressed", "compressed", func(o *squashfs.Options, _ map[string]squashfs.FileDigest) { o.Compression = "gzip" }},
		{"a known file missing", "oci/blobs/sha256/gone", func(_ *squashfs.Options, known map[string]squashfs.FileDigest) {
			known["oci/blobs/sha256/gone"] = squashfs.FileDigest{Size: 1, Digest: "sha256:00"}
		}},
		// The key would read as much as the tree's hashing: not worth it.
		{"mostly not known files", "are not known files", func(o *squashfs.Options, _ map[string]squashfs.FileDigest) {
			f, err := os.Create(filepath.Join(o.Tree, "storage/large"))
			if err == nil {
				err = f.Truncate(KeyReadsAtMost + 1)
				f.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o, known := base(t)
			tt.change(&o, known)
			if key, err := keyOf(t, o, salt, known); !errors.Is(err, ErrNotKeyable) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("key %q, err %v; want ErrNotKeyable naming %q", key, err, tt.want)
			}
		})
	}
}

// A rebuild of the same filesystem copies the kept tree and writes the same
// disk, which kiln verify passes; a damaged kept tree, or one discarded, is
// not used; and a known file whose bytes are not its digest's (a cache that
// lies) gives a disk that verify fails, never one that passes.
func TestKeptVerityTree(t *testing.T) {
	tree := fixtures.StageTree(t)
	trees := &KeptTrees{Dir: filepath.Join(t.TempDir(), "verity")}
	d := disktest.Disk(t, tree)
	keep := partitions.WithKeptTrees(trees, knownBlobs(t, tree))
	build := func(t *testing.T, commit bool) (string, bool) {
		t.Helper()
		steps := &fixtures.Recorder{}
		disk, _ := disktest.Assemble(t, d, keep, partitions.WithProgress(steps))
		reused := steps.Has(KeptTreeStep)
		if commit {
			if err := trees.Commit(); err != nil {
				t.Fatal(err)
			}
		} else {
			trees.Discard()
		}
		return disk, reused
	}
	verify := func(t *testing.T, disk string) error {
		t.Helper()
		_, err := seal.Verify(context.Background(), disk, seal.VerifyOptions{})
		return err
	}
	kept := func(t *testing.T) []string {
		t.Helper()
		ents, _ := os.ReadDir(trees.Dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}

	first, reused := build(t, false)
	if reused || len(kept(t)) != 0 {
		t.Fatalf("first build: reused %v, kept %v after Discard", reused, kept(t))
	}
	if _, reused = build(t, true); reused {
		t.Fatal("a discarded tree was used")
	}
	if names := kept(t); len(names) != 1 {
		t.Fatalf("kept after Commit: %v", names)
	}
	second, reused := build(t, true)
	if !reused {
		t.Fatal("the rebuild of the same filesystem did not use its kept tree")
	}
	if fixtures.HashFile(t, first) != fixtures.HashFile(t, second) {
		t.Fatal("the disk with the kept tree differs from the one hashed")
	}
	if err := verify(t, second); err != nil {
		t.Fatalf("verify of the disk with the kept tree: %v", err)
	}

	// Damaged where it is kept: hashed again, same disk, kept again whole.
	kf := filepath.Join(trees.Dir, kept(t)[0])
	fixtures.FlipByte(t, kf, 100)
	third, reused := build(t, true)
	if reused || fixtures.HashFile(t, third) != fixtures.HashFile(t, first) {
		t.Fatalf("damaged kept tree: reused %v, or the disk differs", reused)
	}
	if _, reused = build(t, true); !reused {
		t.Fatal("the tree hashed after a damaged one was not kept")
	}

	// A known file's bytes changed, its digest not: the kept tree is used
	// (the key trusts the digest), and verify names the image partition.
	big := filepath.Join(tree, "oci/blobs/sha256/big")
	fixtures.FlipByte(t, big, 1<<20)
	lied, reused := build(t, false)
	if !reused {
		t.Fatal("want the kept tree used: the key trusts known files' digests")
	}
	if err := verify(t, lied); err == nil || !strings.Contains(err.Error(), "image partition") {
		t.Fatalf("verify of a disk whose blob is not its digest's: %v", err)
	}
}

// TestAssembleTempDir (issue 26, item 9): Assemble writes its temporary
// files (the Ignition config for debugfs, mksquashfs's pseudo file) in
// its temporary directory and stages the tree to keep in StageDir, never in
// $TMPDIR or beside the kept trees, where a killed build's would stay: the
// builder gives its work directory, which the next build removes.
func TestAssembleTempDir(t *testing.T) {
	for _, compression := range []string{"none", "zstd"} { // zstd: mksquashfs, with a pseudo file for Attrs
		t.Run(compression, func(t *testing.T) {
			tree, work, kept := fixtures.StageTree(t), t.TempDir(), filepath.Join(t.TempDir(), "verity")
			noise := make([]byte, 64<<10) // blocks for verity to hash once compressed
			rand.Read(noise)
			if err := os.WriteFile(filepath.Join(tree, "noise"), noise, 0o644); err != nil {
				t.Fatal(err)
			}
			d := disktest.Disk(t, tree) // (its shared base is made in the real $TMPDIR)
			// A $TMPDIR that does not exist: any temporary file made there
			// fails the assembly.
			t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
			d.Image.Compression = compression
			d.Image.Attrs = []squashfs.FileAttrs{{Path: "kiln.json", Mode: 0o644}}
			trees := &KeptTrees{Dir: kept, StageDir: work}
			disktest.Assemble(t, d, partitions.WithTempDir(work),
				partitions.WithKeptTrees(trees, knownBlobs(t, tree))) // known: so the tree may be kept
			if ents, _ := os.ReadDir(kept); len(ents) > 0 {
				t.Errorf("a tree was staged beside the kept ones: %v", ents)
			}
			if compression != "none" {
				return // a compressed filesystem's tree is not kept
			}
			staged, _ := filepath.Glob(filepath.Join(work, KeptTempPrefix+"*"))
			if len(staged) != 1 {
				t.Fatalf("staged trees in the work directory: %v, want one", staged)
			}
			if err := trees.Commit(); err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(kept); len(ents) != 1 {
				t.Errorf("after Commit the kept directory holds %d entries, want the tree", len(ents))
			}
		})
	}
}
