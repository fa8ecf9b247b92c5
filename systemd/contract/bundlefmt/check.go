package bundlefmt

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/opencontainers/go-digest"
)

// Errors of the node checks, for errors.Is; the messages say what to do.
var (
	ErrOtherAppliance = errors.New("bundle is for another appliance")
	ErrNotNewer       = errors.New("bundle is not newer than the running release")
	ErrWrongBase      = errors.New("delta bundle does not apply to the running release")
	// ErrAlreadyStaged: this very release is staged (the stick was
	// imported before); the import has nothing to do.
	ErrAlreadyStaged = errors.New("this release is already staged")
	ErrNoSpace       = errors.New("not enough free space")
	ErrDamaged       = errors.New("bundle is damaged")
)

// Node is what a node knows of itself when a bundle arrives.
type Node struct {
	Recipe  string
	Arch    string
	Current contract.ReleaseID // the release it runs
	// Staged is the release imported and waiting for its upgrade boot,
	// Trying the one being tried; nil when none is.
	Staged, Trying *contract.ReleaseID
}

// CheckNode decides whether the (verified) bundle is meant for this node:
// its recipe and arch, newer than the running release (so neither a
// downgrade nor a replay of an installed bundle), a delta's base being the
// running release, and no other release staged. Rollback never comes from a
// stick: the node keeps its previous release.
func (m *Manifest) CheckNode(n Node) error {
	if m.Recipe != n.Recipe || m.Arch != n.Arch {
		return fmt.Errorf("%w: it is %s for %s, this node runs %s for %s; use a bundle made from this appliance's recipe",
			ErrOtherAppliance, m.Recipe, m.Arch, n.Recipe, n.Arch)
	}
	this := contract.ReleaseID{Version: m.Version, LockDigest: m.LockDigest}
	if n.Staged != nil && *n.Staged == this {
		return fmt.Errorf("%w: release %s was imported before and waits for its upgrade boot; reboot the appliance to try it", ErrAlreadyStaged, m.Version)
	}
	c, err := contract.CompareVersions(m.Version, n.Current.Version)
	if err != nil {
		return err
	}
	if c <= 0 {
		what := "older than"
		if c == 0 {
			what = "the same as"
		}
		return fmt.Errorf("%w: bundle %s is %s the running %s; a downgrade or a replay is refused (rollback uses the node's own previous release)",
			ErrNotNewer, m.Version, what, n.Current.Version)
	}
	if err := contract.CheckBusy(n.Staged, n.Trying, m.Version); err != nil {
		return err
	}
	if m.Kind == KindDelta && !slices.Contains(m.AppliesTo, n.Current) {
		var bases []string
		for _, r := range m.AppliesTo {
			bases = append(bases, r.Version)
		}
		return fmt.Errorf("%w: it applies to %s, this node runs %s; use a full bundle or a delta from %s",
			ErrWrongBase, strings.Join(bases, ", "), n.Current.Version, n.Current.Version)
	}
	return nil
}

// CheckSpace checks that free bytes on the node's /var hold the import.
func (m *Manifest) CheckSpace(free int64) error {
	need := m.Space.Need()
	if free >= need {
		return nil
	}
	return fmt.Errorf("%w on /var: the import needs %s (%s of blobs, %s unpacked), %s is free; free %s more (e.g. remove old logs or unused images) and plug the stick in again; nothing was changed",
		ErrNoSpace, human.Bytes(need), human.Bytes(m.Space.CopyBytes), human.Bytes(m.Space.UnpackedBytes), human.Bytes(free), human.Bytes(need-free))
}

// Validate checks the manifest is consistent with itself: the writer calls
// it before signing, the node after verifying.
func (m *Manifest) Validate() error {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if _, err := contract.ParseVersion(m.Version); err != nil {
		bad("%v", err)
	}
	switch {
	case m.SchemaVersion == 1 && (m.Kiln != version.Info{} || m.AgentVersion != version.Info{}):
		bad("schema 1 has no kiln or agentVersion")
	case m.SchemaVersion > 1 && (m.Kiln.Version == "" || m.AgentVersion.Edition == ""):
		bad("schema %d names the kiln that made the bundle and the agent's edition", m.SchemaVersion)
	}
	switch m.Kind {
	case KindFull:
		if len(m.AppliesTo) > 0 {
			bad("a full bundle lists no appliesTo")
		}
	case KindDelta:
		if len(m.AppliesTo) == 0 {
			bad("a delta bundle must list the releases it applies to")
		}
	default:
		bad("kind %q: want %s or %s", m.Kind, KindFull, KindDelta)
	}
	blobs := map[string]Blob{}
	var space Space
	for i, b := range m.Blobs {
		if i > 0 && m.Blobs[i-1].Digest >= b.Digest {
			bad("blobs not sorted by digest, or listed twice, at %s", b.Digest)
		}
		blobs[b.Digest] = b
		if b.OnStick {
			space.CopyBytes += b.Size
			space.UnpackedBytes += b.Unpacked
		} else if m.Kind == KindFull {
			bad("full bundle leaves out blob %s", b.Digest)
		}
	}
	if space != m.Space {
		bad("space %+v does not add up to the blobs on the stick (%+v)", m.Space, space)
	}
	for i, img := range m.Images {
		if i > 0 && m.Images[i-1].Name >= img.Name {
			bad("images not sorted by name, or listed twice, at %s", img.Name)
		}
		for _, d := range append([]string{img.Digest}, img.Blobs...) {
			if _, ok := blobs[d]; !ok {
				bad("image %s names blob %s, which is not in blobs", img.Name, d)
			}
		}
	}
	for i, f := range m.ReleaseFiles {
		if err := contract.CheckReleasePath(f.Path); err != nil {
			bad("release file %v", err)
		}
		if i > 0 && m.ReleaseFiles[i-1].Path >= f.Path {
			bad("release files not sorted, or listed twice, at %s", f.Path)
		}
	}
	if m.Kind == KindFull && !m.AgentOnStick {
		bad("a full bundle must carry its agent")
	}
	if m.Agent.Path != AgentBinary {
		bad("agent path %q, want %s", m.Agent.Path, AgentBinary)
	}
	if f := m.Filesystem; f.Size <= 0 || f.Size%4096 != 0 || !isSHA256(f.Metadata) {
		bad("filesystem of %d bytes, metadata %q: want a positive multiple of 4096 and a sha256 digest", f.Size, f.Metadata)
	}
	end := int64(0)
	for _, f := range m.byOffset() {
		switch {
		case f.Size < 0 || f.Offset < 0 || f.Offset+f.Size > m.Filesystem.Size:
			bad("file %s: %d bytes at %d lie outside the %d-byte filesystem", f.Path, f.Size, f.Offset, m.Filesystem.Size)
		case f.Offset < end:
			bad("file %s: its bytes at %d overlap another file's", f.Path, f.Offset)
		}
		end = max(end, f.Offset+f.Size)
	}
	if len(m.Trust) == 0 {
		bad("no trusted keys: a node could never take another bundle")
	}
	m.validateOS(bad)
	if len(problems) > 0 {
		return fmt.Errorf("%w: manifest: %s", ErrDamaged, strings.Join(problems, "; "))
	}
	return nil
}

// CheckFilesystem re-hashes the filesystem (its bytes at offset in r): each
// file's contents at its offset against its digest, every other byte
// against Metadata, copying what it reads to progress (may be nil). It names
// every damaged file.
func (m *Manifest) CheckFilesystem(r io.ReaderAt, offset int64, progress io.Writer) error {
	var bad []string
	buf := make([]byte, 1<<20)
	for _, f := range m.byOffset() {
		got, err := HashRange(r, offset+f.Offset, f.Size, progress, buf)
		if err != nil {
			return fmt.Errorf("read bundle filesystem: %w", err)
		}
		if got != f.Digest {
			bad = append(bad, fmt.Sprintf("%s (bytes %d-%d of the filesystem)", f.Path, f.Offset, f.Offset+f.Size-1))
		}
	}
	got, err := m.HashMetadata(r, offset, progress)
	if err != nil {
		return err
	}
	if got != m.Filesystem.Metadata {
		bad = append(bad, "the filesystem's metadata (superblock, tables: the bytes outside every file)")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s differ from the signed manifest", ErrDamaged, strings.Join(bad, ", "))
	}
	return nil
}

// HashMetadata returns the sha256 of the filesystem's bytes (at offset in
// r) outside every file's contents, in order: what Filesystem.Metadata pins.
// The files must not overlap (Validate).
func (m *Manifest) HashMetadata(r io.ReaderAt, offset int64, progress io.Writer) (string, error) {
	h := sha256.New()
	var w io.Writer = h
	if progress != nil {
		w = io.MultiWriter(h, progress)
	}
	at := int64(0)
	gap := func(end int64) error {
		if end <= at {
			return nil
		}
		n, err := io.Copy(w, io.NewSectionReader(r, offset+at, end-at))
		if err == nil && n != end-at {
			err = fmt.Errorf("truncated: %d of %d bytes at byte %d", n, end-at, offset+at)
		}
		if err != nil {
			return fmt.Errorf("read bundle filesystem: %w", err)
		}
		return nil
	}
	for _, f := range m.byOffset() {
		if err := gap(f.Offset); err != nil {
			return "", err
		}
		at = max(at, f.Offset+f.Size)
	}
	if err := gap(m.Filesystem.Size); err != nil {
		return "", err
	}
	return digest.NewDigest(digest.SHA256, h).String(), nil
}

// byOffset is the files in the order their contents lie in the filesystem.
func (m *Manifest) byOffset() []File {
	files := slices.Clone(m.Files)
	slices.SortStableFunc(files, func(a, b File) int { return cmp.Compare(a.Offset, b.Offset) })
	return files
}

func isSHA256(d string) bool {
	hx, ok := strings.CutPrefix(d, "sha256:")
	_, err := hex.DecodeString(hx)
	return ok && len(hx) == 64 && err == nil
}

// HashRange returns the sha256 of n bytes of r at off ("sha256:…"), copying
// them to progress (may be nil); buf is the read buffer (nil: 1 MiB). A
// short read is an error.
func HashRange(r io.ReaderAt, off, n int64, progress io.Writer, buf []byte) (string, error) {
	h := sha256.New()
	var w io.Writer = h
	if progress != nil {
		w = io.MultiWriter(h, progress)
	}
	if buf == nil {
		buf = make([]byte, 1<<20)
	}
	got, err := io.CopyBuffer(w, io.NewSectionReader(r, off, n), buf)
	if err != nil {
		return "", err
	}
	if got != n {
		return "", fmt.Errorf("truncated: %d of %d bytes at byte %d", got, n, off)
	}
	return digest.NewDigest(digest.SHA256, h).String(), nil
}

// Release is the node's record of the bundle's release (what
// release.Machine.Import stages): its images, its files, and the blobs it
// keeps in the release store — every blob of its images that onPartition
// (the node's image partition) lacks, on the stick or already stored for a
// base release, and its files' contents. Sorted, without duplicates.
func (m *Manifest) Release(onPartition func(digest string) bool) contract.Release {
	r := contract.Release{Version: m.Version, LockDigest: m.LockDigest, Files: slices.Clone(m.ReleaseFiles), Trust: slices.Clone(m.Trust)}
	seen := map[string]bool{}
	keep := func(d string) {
		if !seen[d] {
			seen[d] = true
			r.Blobs = append(r.Blobs, d)
		}
	}
	for _, img := range m.Images {
		r.Images = append(r.Images, img.Image)
		for _, d := range append([]string{img.Digest}, img.Blobs...) {
			if !onPartition(d) {
				keep(d)
			}
		}
	}
	for _, f := range m.ReleaseFiles {
		keep(f.Digest)
	}
	slices.Sort(r.Blobs)
	return r
}
