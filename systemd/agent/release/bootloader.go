package release

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/kiln-appliance/kiln/systemd/agent/bootloader"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

// On a node whose OS is in A/B slots, a release whose OS (or kernel) differs
// from the current one's boots from an entry of its own, written with tries
// left (systemd-boot's boot counting), and the boot loader decides which
// release runs: it boots the new entry while it has tries, and falls back to
// the older one by itself when they run out (a kernel that never reaches
// userspace included). The state follows what the boot loader booted, at
// every boot, before anything else (Begin): it never says a release is
// current, or being tried, that the boot loader did not boot.

// bootedEntry is the ID of the entry this boot came from ("" when the boot
// loader does not say).
func (m *Machine) bootedEntry() (string, error) {
	return bootloader.Booted(m.path(bootloader.Efivars))
}

func (m *Machine) esp() string { return m.path(bootloader.ESP) }

// followBootLoader reconciles s with the entry booted: decided is true when
// it settled Begin's transition (err is then the transition's outcome).
func (m *Machine) followBootLoader(s *state.State, booted string) (decided bool, err error) {
	if booted == "" {
		return false, nil
	}
	switch {
	case ownEntry(s.Staged, s.Current) && booted != s.Staged.OS.Entry:
		n, found, err := bootloader.Find(m.esp(), s.Staged.OS.Entry)
		if err != nil {
			return true, err
		}
		if !found || !n.Bad() {
			// Not booted yet: its entry has tries left, or is written by
			// this boot's converge (an import cut before it wrote it).
			if found {
				fmt.Fprintf(m.log, "release %s is staged and its boot entry %s has %d tries left, but the boot loader booted %s: it is tried when the boot loader boots it\n", s.Staged.Version, n, n.Left, booted)
			}
			return true, errUnchanged
		}
		v := s.Staged.Version
		retire(s, *s.Staged)
		s.Staged = nil
		s.Last = m.result("rollback", v, false, fmt.Sprintf("release %s never reached boot-complete: the boot loader tried its entry %d times (%s) and booted %s again; its kernel or initramfs does not boot on this node", v, n.Done, n, booted))
	case ownEntry(s.Trying, s.Current) && booted != s.Trying.OS.Entry:
		v := s.Trying.Version
		retire(s, *s.Trying)
		s.Trying, s.Attempts, s.TryingBoot = nil, 0, ""
		s.Last = m.result("rollback", v, false, fmt.Sprintf("release %s did not reach boot-complete within its tries: the boot loader booted %s (release %s) again", v, booted, s.Current.Version))
	case s.Previous != nil && ownEntry(&s.Current, *s.Previous) && booted == s.Previous.OS.Entry:
		// Confirmed, but never blessed: its tries ran out before a boot
		// reached boot-complete, and the boot loader went back.
		v := s.Current.Version
		for _, r := range []*contract.Release{s.Staged, s.Trying, &s.Current} {
			if r != nil {
				retire(s, *r)
			}
		}
		s.Current, s.Previous, s.Staged, s.Trying, s.Attempts, s.TryingBoot = *s.Previous, nil, nil, nil, 0, ""
		s.Last = m.result("rollback", v, false, fmt.Sprintf("release %s was confirmed but its boot entry never blessed: its tries ran out and the boot loader booted %s (release %s) again", v, booted, s.Current.Version))
	default:
		for _, r := range s.Retired {
			if r.OS != nil && r.OS.Entry == booted {
				// A power cut between a rollback's state write and the
				// entry's removal: converge removes it now, and
				// kiln-release-good (a counted boot) reboots.
				fmt.Fprintf(m.log, "kiln: the boot loader booted %s, the entry of release %s, which the node no longer keeps: its entry is removed, and the next boot runs release %s\n", booted, r.Version, s.Current.Version)
			}
		}
		return false, nil
	}
	fmt.Fprintf(m.log, "kiln: %s; the node is back on release %s\n", s.Last.Message, s.Current.Version)
	return true, nil
}

// syncEntries makes the ESP's entries match the state: a retired release's
// entry removed (unless a kept release boots from it), the staged release's
// written with tries left when it is not there yet (the import writes its
// slot and boot files, records it staged, and this writes the entry, last),
// and the boot files no entry names any more removed.
func (m *Machine) syncEntries(s *state.State) error {
	if !ownEntry(s.Staged, s.Current) && !anyOS(s.Retired) {
		return nil
	}
	esp := m.esp()
	kept := map[string]bool{}
	for _, r := range s.Releases() {
		if r.OS != nil {
			kept[r.OS.Entry] = true
		}
	}
	for _, r := range s.Retired {
		if r.OS == nil || kept[r.OS.Entry] {
			continue
		}
		n, found, err := bootloader.Find(esp, r.OS.Entry)
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		m.step("remove entry " + r.OS.Entry)
		files, err := bootloader.RemoveWithFiles(esp, r.OS.Entry)
		if err != nil {
			return err
		}
		fmt.Fprintf(m.log, "boot loader: entry %s of release %s removed, and %d kernel or initramfs file(s) no other entry boots\n", n, r.Version, len(files))
	}
	if ownEntry(s.Staged, s.Current) {
		e, ok := s.Staged.OS.BootEntry()
		if _, found, err := bootloader.Find(esp, s.Staged.OS.Entry); err != nil {
			return err
		} else if d := s.Staged.OS.UKI; d != "" && !found {
			// A Secure Boot node's: the import put the signed image on
			// the ESP by digest, checked; it becomes the entry.
			m.step("install entry " + s.Staged.OS.Entry)
			if err := bootloader.InstallUKI(esp, s.Staged.OS.Entry, filepath.Join(esp, filepath.FromSlash(bootentry.FilePath(d))), bootentry.DefaultTries); err != nil {
				return err
			}
			fmt.Fprintf(m.log, "boot loader: entry %s of release %s written, %d tries\n", bootentry.UKIFileName(s.Staged.OS.Entry, bootentry.DefaultTries), s.Staged.Version, bootentry.DefaultTries)
		} else if ok && !found {
			m.step("install entry " + e.ID)
			if err := bootloader.Install(esp, e, bootentry.DefaultTries); err != nil {
				return err
			}
			fmt.Fprintf(m.log, "boot loader: entry %s of release %s written, %d tries\n", bootentry.FileName(e.ID, bootentry.DefaultTries), s.Staged.Version, bootentry.DefaultTries)
		}
	}
	if len(s.Retired) == 0 {
		return nil
	}
	m.step("remove boot files")
	gone, err := bootloader.RemoveUnusedBootFiles(esp)
	if len(gone) > 0 {
		fmt.Fprintf(m.log, "boot loader: %d kernel or initramfs file(s) no entry boots removed from the ESP\n", len(gone))
	}
	return err
}

func anyOS(rs []contract.Release) bool {
	for _, r := range rs {
		if r.OS != nil {
			return true
		}
	}
	return false
}

// ErrNotConfirmed: the booted entry's release is not the confirmed current
// one, so the boot loader must not mark the entry good.
var ErrNotConfirmed = errors.New("not confirmed")

// Confirmed says whether this boot's entry may be blessed: the boot loader
// booted the current release's entry and nothing is being tried. It returns
// that release.
func (m *Machine) Confirmed() (*contract.Release, error) {
	booted, err := m.bootedEntry()
	if err != nil {
		return nil, err
	}
	s, err := m.Load()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotConfirmed, err)
	}
	switch {
	case booted == "":
		return nil, fmt.Errorf("%w: the boot loader does not say which entry it booted", ErrNotConfirmed)
	case s.Trying != nil:
		return nil, fmt.Errorf("%w: release %s is being tried (boot %d), its health check has not passed", ErrNotConfirmed, s.Trying.Version, s.Attempts)
	case s.Current.OS == nil || s.Current.OS.Entry != booted:
		return nil, fmt.Errorf("%w: this boot came from entry %s, and the current release %s boots from another", ErrNotConfirmed, booted, s.Current.Version)
	}
	return &s.Current, nil
}
