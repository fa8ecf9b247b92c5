package release

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/pins"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/opencontainers/go-digest"
)

// Converge makes everything derived from the state match it, without
// changing the state (except to forget retired releases once they are gone).
// Every boot may run it; it is what finishes a transition that was killed.
func (m *Machine) Converge(ctx context.Context) (*state.State, error) {
	unlock, err := m.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	s, err := m.Load()
	if err != nil {
		return nil, err
	}
	return s, m.converge(ctx, s)
}

// converge derives, in an order that never leaves a kept release without
// what it needs: the boot loader's entries (a retired release's first, so
// the boot loader cannot pick it again), the active release's files (from blobs nothing has removed
// yet), the current release's trusted keys, then the pins narrowed to the kept releases (after the files, so a
// rolled-back release's workloads are gone before its images are unpinned),
// then retired images and blobs, then the state forgets the retired.
func (m *Machine) converge(ctx context.Context, s *state.State) error {
	if err := m.syncEntries(s); err != nil {
		return err
	}
	if err := m.syncFiles(s); err != nil {
		return err
	}
	if err := m.syncTrust(s); err != nil {
		return err
	}
	m.step("narrow pins")
	if err := m.syncPins(ctx, s.Releases()); err != nil {
		return err
	}
	if err := m.removeImages(ctx, s); err != nil {
		return err
	}
	if err := m.collectBlobs(s); err != nil {
		return err
	}
	if len(s.Retired) == 0 {
		return nil
	}
	m.step("forget retired")
	s.Retired = nil
	return m.writeState(s)
}

// pinsApplied records the digest of the pins drop-in CRI-O was last told to
// read. It is on tmpfs: after a reboot CRI-O reads the drop-in anew.
const pinsApplied = "/run/kiln/pins.applied"

// syncPins writes the pins for releases' images if the drop-in differs, and
// has CRI-O read them unless it already did (a marker on /run holds the
// digest it was last told about, so a kill between the write and the reload
// is finished by the next run, and a reboot starts afresh).
func (m *Machine) syncPins(ctx context.Context, releases []contract.Release) error {
	// Each image once: the releases share images, and the old and new
	// state of a transition are the same releases mostly.
	var images []contract.Image
	seen := map[string]bool{}
	for _, r := range releases {
		for _, im := range r.Images {
			if k := im.Name + "@" + im.Digest; !seen[k] {
				seen[k] = true
				images = append(images, im)
			}
		}
	}
	data, err := contract.RenderPins(images)
	if err != nil {
		return err
	}
	dropIn := m.path(contract.PinsDropIn)
	if cur, err := os.ReadFile(dropIn); err != nil || !bytes.Equal(cur, data) {
		m.step("write pins")
		if err := pins.Write(dropIn, images); err != nil { // its temp file outside crio.conf.d
			return err
		}
		fmt.Fprintf(m.log, "pins: %d image(s) pinned in %s\n", len(images), contract.PinsDropIn)
	}
	want := digest.FromBytes(data).String() + "\n"
	marker := m.path(pinsApplied)
	if got, err := os.ReadFile(marker); err == nil && string(got) == want {
		return nil
	}
	m.step("apply pins")
	if err := m.applier.ApplyPins(ctx); err != nil {
		return fmt.Errorf("pins written to %s, but CRI-O was not told: %w", contract.PinsDropIn, err)
	}
	return atomicfile.WriteFile(marker, []byte(want), 0o644)
}

// syncFiles installs the active release's files and removes every other
// file a known release (kept or retired) owns.
func (m *Machine) syncFiles(s *state.State) error {
	active := s.Active()
	want := map[string]bool{}
	files := append([]contract.ReleaseFile(nil), active.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		want[f.Path] = true
		ok, err := m.installed(f)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		m.step("install " + f.Path)
		if err := m.install(f); err != nil {
			return fmt.Errorf("install release %s: %w", active.Version, err)
		}
		fmt.Fprintf(m.log, "release %s: installed %s\n", active.Version, f.Path)
	}
	var owned []string
	for _, r := range append(s.Releases(), s.Retired...) {
		for _, f := range r.Files {
			if !want[f.Path] {
				owned = append(owned, f.Path)
			}
		}
	}
	sort.Strings(owned)
	owned = slices.Compact(owned)
	for _, p := range owned {
		if _, err := os.Lstat(m.path(p)); os.IsNotExist(err) {
			continue
		}
		m.step("remove " + p)
		if err := atomicfile.Remove(m.path(p)); err != nil {
			return err
		}
		fmt.Fprintf(m.log, "release %s: removed %s\n", active.Version, p)
	}
	return nil
}

// installed reports whether f is on the node with its content and mode.
func (m *Machine) installed(f contract.ReleaseFile) (bool, error) {
	file, err := os.Open(m.path(f.Path))
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check release file: %w", err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != f.Size || uint32(fi.Mode().Perm()) != f.Mode {
		return false, nil
	}
	v := digest.Digest(f.Digest).Verifier()
	if _, err := io.Copy(v, file); err != nil {
		return false, fmt.Errorf("check release file %s: %w", f.Path, err)
	}
	return v.Verified(), nil
}

// install writes f from its blob, verifying size and digest as it streams;
// a mismatch leaves the node's file as it was.
func (m *Machine) install(f contract.ReleaseFile) error {
	src, err := m.findBlob(f.Digest)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.Write(m.path(f.Path), os.FileMode(f.Mode), func(w io.Writer) error {
		v := digest.Digest(f.Digest).Verifier()
		n, err := io.Copy(io.MultiWriter(w, v), in)
		if err != nil {
			return fmt.Errorf("copy from %s: %w", src, err)
		}
		if n != f.Size || !v.Verified() {
			return fmt.Errorf("%s (%d bytes) does not match %s (%d bytes): the stored blob is damaged", src, n, f.Digest, f.Size)
		}
		return nil
	})
}

// storeBlob is where the release store keeps blob d.
func (m *Machine) storeBlob(d string) string {
	alg, hex, _ := strings.Cut(d, ":")
	return filepath.Join(m.path(contract.ReleaseStore), "blobs", alg, hex)
}

// findBlob finds blob d in the release store, else on the image partition.
func (m *Machine) findBlob(d string) (string, error) {
	alg, hex, _ := strings.Cut(d, ":")
	for _, p := range []string{m.storeBlob(d), filepath.Join(m.path(contract.MountPoint), contract.OCIDir, "blobs", alg, hex)} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("content %s is neither in the release store (%s) nor on the image partition (%s)", d, contract.ReleaseStore, contract.MountPoint)
}

// removeImages removes retired releases' images that no kept release uses.
func (m *Machine) removeImages(ctx context.Context, s *state.State) error {
	if m.images == nil || len(s.Retired) == 0 {
		return nil
	}
	kept := map[string]bool{}
	for _, r := range s.Releases() {
		for _, im := range r.Images {
			kept[im.Digest] = true
		}
	}
	var gone []contract.Image
	for _, r := range s.Retired {
		for _, im := range r.Images {
			if !kept[im.Digest] {
				kept[im.Digest] = true // once
				gone = append(gone, im)
			}
		}
	}
	if len(gone) == 0 {
		return nil
	}
	m.step("remove images")
	if err := m.images.RemoveImages(ctx, gone); err != nil {
		return fmt.Errorf("remove retired images: %w", err)
	}
	return nil
}

// collectBlobs removes every blob in the release store that no kept release
// lists (a retired release's, or one an interrupted import left behind).
// Only the store on /var is touched, never the image partition.
func (m *Machine) collectBlobs(s *state.State) error {
	kept := map[string]bool{}
	for _, r := range s.Releases() {
		for _, b := range r.Blobs {
			kept[b] = true
		}
	}
	root := filepath.Join(m.path(contract.ReleaseStore), "blobs")
	algs, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("collect release store: %w", err)
	}
	for _, alg := range algs {
		dir := filepath.Join(root, alg.Name())
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("collect release store: %w", err)
		}
		removed := 0
		for _, e := range entries {
			if kept[alg.Name()+":"+e.Name()] {
				continue
			}
			m.step("remove blob " + alg.Name() + ":" + e.Name())
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("collect release store: %w", err)
			}
			removed++
		}
		if removed > 0 {
			// One directory sync for the lot: a removal the power cut undoes
			// is simply removed again by the next run.
			if err := atomicfile.SyncDir(dir); err != nil {
				return err
			}
			fmt.Fprintf(m.log, "release store: removed %d blob(s) no kept release uses\n", removed)
		}
	}
	return nil
}
