package release

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

// Key rotation. The keys the node accepts bundles from are the current
// release's (contract.Release.Trust): a release brings the next set, and it
// takes effect once that release is confirmed, never while it is tried (a
// release that fails its health check must not have changed whom the node
// trusts). Like the pins and the release files, contract.TrustDir is derived
// from the state at every converge.

// captureTrust records the keys in TrustDir (Ignition wrote them from the
// recipe's trust) as the factory release's.
func (m *Machine) captureTrust(r *contract.Release) error {
	keys, err := bundlefmt.ReadTrustDir(m.path(contract.TrustDir))
	if err != nil {
		return fmt.Errorf("record the factory release's trusted keys: %w", err)
	}
	r.Trust = keys
	return nil
}

// checkTrust refuses a trust set the node could not install.
func checkTrust(keys []contract.TrustKey) error {
	for _, k := range keys {
		pub, err := bundlefmt.ParsePublicKey([]byte(k.PublicKey))
		if err != nil {
			return fmt.Errorf("trusted key %s: %w", k.KeyID, err)
		}
		if id, err := bundlefmt.KeyID(pub); err != nil || id != k.KeyID {
			return fmt.Errorf("trusted key %s: its key ID is %s", k.KeyID, id)
		}
	}
	return nil
}

// syncTrust makes TrustDir hold exactly the current release's keys. The new
// set is written whole beside it and swapped in with one rename
// (RENAME_EXCHANGE), so an import reads the old set or the new one, never a
// mix, and a cut anywhere leaves one of them; the old set, now beside it, is
// removed after. A current release that records no keys (a state written
// before releases carried them) leaves TrustDir as it is.
func (m *Machine) syncTrust(s *state.State) error {
	want := s.Current.Trust
	if len(want) == 0 {
		return nil
	}
	dir := m.path(contract.TrustDir)
	spare := filepath.Join(filepath.Dir(dir), ".trust.old") // the last set swapped out, or a set being built
	if err := os.RemoveAll(spare); err != nil {
		return fmt.Errorf("trusted keys: %w", err)
	}
	if same, err := m.trustIs(dir, want); err != nil || same {
		return err
	}
	m.step("write trust")
	if err := os.MkdirAll(spare, 0o755); err != nil {
		return fmt.Errorf("trusted keys: %w", err)
	}
	for _, k := range want {
		if err := atomicfile.WriteFile(filepath.Join(spare, k.FileName()), []byte(k.PublicKey), 0o644); err != nil {
			return fmt.Errorf("trusted keys: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("trusted keys: %w", err)
	}
	m.step("swap trust")
	if err := unix.Renameat2(unix.AT_FDCWD, spare, unix.AT_FDCWD, dir, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("trusted keys: swap %s in: %w", dir, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	var ids []string
	for _, k := range want {
		ids = append(ids, k.KeyID)
	}
	fmt.Fprintf(m.log, "trusted keys: release %s's: %s (in %s)\n", s.Current.Version, strings.Join(ids, ", "), contract.TrustDir)
	m.step("remove old trust")
	if err := os.RemoveAll(spare); err != nil {
		return fmt.Errorf("trusted keys: %w", err)
	}
	return nil
}

// trustIs reports whether dir holds exactly want's key files (no other
// .pub file), byte for byte.
func (m *Machine) trustIs(dir string, want []contract.TrustKey) (bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("trusted keys: %w", err)
	}
	var have []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".pub") {
			have = append(have, e.Name())
		}
	}
	var names []string
	for _, k := range want {
		names = append(names, k.FileName())
		data, err := os.ReadFile(filepath.Join(dir, k.FileName()))
		if err != nil || !bytes.Equal(data, []byte(k.PublicKey)) {
			return false, nil
		}
	}
	slices.Sort(have)
	slices.Sort(names)
	return slices.Equal(have, slices.Compact(names)), nil
}
