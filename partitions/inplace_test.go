package partitions_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	diskfs "github.com/diskfs/go-diskfs/filesystem/squashfs"

	. "github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/internal/disktest"
	"github.com/kiln-appliance/kiln/partitions/internal/fixtures"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// A file linked into the tree from elsewhere is packed with the mode and
// owner Attrs give it, and its bytes; the original keeps its own mode.
func TestAttrs(t *testing.T) {
	tree := fixtures.StageTree(t)
	big := filepath.Join(tree, "oci/blobs/sha256/big")
	if err := os.Chmod(big, 0o600); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(big)
	if err != nil {
		t.Fatal(err)
	}
	d := disktest.Disk(t, tree)
	d.Image.Attrs = []squashfs.FileAttrs{{Path: "oci/blobs/sha256/big", Mode: 0o644, UID: 4321, GID: 8765}}
	disk, _ := disktest.Assemble(t, d)
	if fi, _ := os.Stat(big); fi.Mode().Perm() != 0o600 {
		t.Errorf("the staged file's mode changed to %v", fi.Mode())
	}
	fsys, c, err := squashfs.OpenImagePartition(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := fs.ReadFile(fsys, "oci/blobs/sha256/big"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("packed file: %d bytes, %v; want the staged file's %d", len(got), err, len(want))
	}
	fi, err := fs.Stat(fsys, "oci/blobs/sha256/big")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := fi.Sys().(*diskfs.StatT)
	if fi.Mode().Perm() != 0o644 || st == nil || st.UID != 4321 || st.GID != 8765 {
		t.Errorf("packed file: mode %v, owner %+v; want 0644 owned by 4321:8765", fi.Mode(), st)
	}
	// Files Attrs does not name keep their own.
	fi, err = fs.Stat(fsys, "storage/overlay/l1/diff/ping")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := fi.Sys().(*diskfs.StatT); st == nil || st.UID != 1000 || st.GID != 1001 {
		t.Errorf("ping: owner %+v, want 1000:1001 as staged", st)
	}
}

// A failing check of the files' digests fails the assembly, whatever else
// went well, whichever way they are read.
func TestFileHashesCheckFails(t *testing.T) {
	tree := fixtures.StageTree(t)
	bad := errors.New("blob changed")
	check := WithFileHashes([]string{"oci/blobs/sha256/big"}, "check the blobs", func(map[string]squashfs.FileDigest) error { return fmt.Errorf("check: %w", bad) })
	for _, tc := range []struct {
		name     string
		noVerity bool
	}{
		{"verity pass", false},
		{"through the filesystem", true},
	} {
		d := disktest.Disk(t, tree)
		d.Image.NoVerity = tc.noVerity
		if err := disktest.Try(t, d, check); !errors.Is(err, bad) {
			t.Errorf("%s: Assemble with a failing check: %v, want it", tc.name, err)
		}
	}
}

// HashFiles gets each named file's size and sha256 as written, whichever
// way it is read: in the verity pass (uncompressed, verity on) or through
// the filesystem (no verity; compressed); sparse blocks, empty files,
// multi-block files and both names of a hard link included.
func TestHashFiles(t *testing.T) {
	tree := fixtures.StageTree(t)
	rnd := make([]byte, 2*MiB)
	rand.Read(rnd)
	extra := map[string][]byte{
		"oci/blobs/sha256/holey": append(append(append([]byte{}, rnd[:MiB]...), make([]byte, 2*MiB)...), rnd[MiB:MiB+100]...),
		"oci/blobs/sha256/zeros": make([]byte, MiB+MiB/2),
		"oci/blobs/sha256/empty": nil,
		"oci/blobs/sha256/exact": rnd,
	}
	for name, data := range extra {
		if err := os.WriteFile(filepath.Join(tree, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	paths := []string{"oci/blobs/sha256/big", "storage/overlay/l1/diff/etc/passwd", "storage/overlay/l1/diff/etc/passwd-hardlink",
		"oci/blobs/sha256/" + fmt.Sprintf("%064x", 7), "kiln.json"}
	for name := range extra {
		paths = append(paths, name)
	}
	want := map[string]squashfs.FileDigest{}
	for _, p := range paths {
		data, err := os.ReadFile(filepath.Join(tree, p))
		if err != nil {
			t.Fatal(err)
		}
		want[p] = squashfs.FileDigest{Size: int64(len(data)), Digest: fmt.Sprintf("sha256:%x", sha256.Sum256(data))}
	}
	for _, tc := range []struct {
		name        string
		noVerity    bool
		compression string
	}{
		{"verity pass", false, ""},
		{"no verity", true, ""},
		{"compressed", false, "zstd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := disktest.Disk(t, tree)
			d.Image.NoVerity, d.Image.Compression = tc.noVerity, tc.compression
			rec := &fixtures.Recorder{}
			var got map[string]squashfs.FileDigest
			hashes := WithFileHashes(paths, "check the blobs", func(sums map[string]squashfs.FileDigest) error {
				if got != nil {
					t.Error("the digests were handed over twice")
				}
				got = sums
				return nil
			})
			disk, l := disktest.Assemble(t, d, hashes, WithProgress(rec))
			if tc.name == "verity pass" { // kiln's writer stores zero blocks (mksquashfs made them sparse): one extent
				f, err := os.Open(disk)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				img, _ := l.Find(contract.PartitionName)
				raw, err := squashfs.OpenRaw(io.NewSectionReader(f, img.Offset, img.Size))
				if err != nil {
					t.Fatal(err)
				}
				files, err := raw.Files([]string{"oci/blobs/sha256/holey"})
				if err != nil {
					t.Fatal(err)
				}
				if e := files[0].Extents; len(e) != 1 || e[0].Sparse || e[0].N != files[0].Size {
					t.Errorf("extents of a file with a 2 MiB zero run: %+v, want one stored run of %d bytes", e, files[0].Size)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("digests:\n got %v\nwant %v", got, want)
			}
			rec.Check(t, map[string]int64{"check the blobs": -1})
		})
	}

	// A path the filesystem lacks fails the assembly, naming it.
	missing := WithFileHashes([]string{"oci/blobs/sha256/missing"}, "check the blobs", func(map[string]squashfs.FileDigest) error { return nil })
	if err := disktest.Try(t, disktest.Disk(t, tree), missing); err == nil || !strings.Contains(err.Error(), "oci/blobs/sha256/missing") {
		t.Fatalf("Assemble hashing a missing file: %v", err)
	}
}
