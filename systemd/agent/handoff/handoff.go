// Package handoff runs the kiln agent of the release the boot loader booted.
//
// Every unit runs the agent on the image partition (contract.AgentPath: the
// factory's, on dm-verity, never changed). A release whose agent is another
// one has it in the release store, by digest, and its boot loader entry says
// so on the kernel command line (Param=sha256:HEX), written by the import
// from the signed manifest. The image partition's agent then hands off at
// once: it copies that blob into a sealed memory file, checking its sha256
// as it copies (what runs is exactly what was checked, whatever the disk
// answers later), and execs it with the same arguments. So the agent
// follows the entry: after an upgrade the new release's, after the boot
// loader falls back the old one's, with nothing a new agent writes in the
// way (docs/decisions.md, *Which kiln-agent runs*).
package handoff

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/opencontainers/go-digest"
)

// Param is the kernel parameter naming the release's agent: kiln.agent=sha256:HEX.
const Param = contract.AgentParam

// Env is set, to the digest, in the agent handed off to: it runs itself.
const Env = "KILN_AGENT_HANDOFF"

var digestForm = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Target is the digest the kernel command line (cmdline's contents) names,
// "" when it names none.
func Target(cmdline string) (string, error) {
	d := ""
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, Param+"="); ok {
			d = v // the last one wins, as for systemd's own parameters
		}
	}
	if d != "" && !digestForm.MatchString(d) {
		return "", fmt.Errorf("the kernel command line's %s=%q is not sha256:HEX", Param, d)
	}
	return d, nil
}

// Run hands off when this process is the image partition's agent (under
// root, from args' --root, "/" by default) and the booted entry names
// another one; it returns nil when this agent is the one to run, and an
// error when the named agent cannot run (missing, damaged): the boot's kiln
// units then fail, the entry is never blessed, and the boot loader goes
// back to the release before.
func Run(args []string) error {
	if os.Getenv(Env) != "" {
		return nil
	}
	root := rootArg(args)
	self, err := os.Executable()
	if err != nil || filepath.Clean(self) != filepath.Join(root, contract.AgentPath) {
		return nil //nolint:nilerr // not the node's agent (the factory's kiln, a test binary): nothing to hand off
	}
	b, err := os.ReadFile(filepath.Join(root, "/proc/cmdline"))
	if err != nil {
		return nil //nolint:nilerr // no kernel command line (a test's tree without one): this agent runs
	}
	d, err := Target(string(b))
	if err != nil || d == "" {
		return err
	}
	return Exec(root, d, args)
}

// rootArg is the value of a --root argument (the node tree tests run on).
func rootArg(args []string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--root="); ok {
			return v
		}
		if a == "--root" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return "/"
}

// Exec runs the agent with digest d from the release store under root, its
// bytes checked as they are copied into a sealed memory file; it returns
// only when it cannot.
func Exec(root, d string, args []string) error {
	src := filepath.Join(root, contract.ReleaseStore, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
	what := fmt.Sprintf("this boot's entry runs kiln agent %s (%s=)", d, Param)
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("%s: %w; the release store lacks it: the boot loader goes back to the release before once this entry's tries run out", what, err)
	}
	defer in.Close()
	fd, err := unix.MemfdCreate("kiln-agent", unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fmt.Errorf("%s: memfd: %w", what, err)
	}
	mem := os.NewFile(uintptr(fd), "kiln-agent")
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(mem, h), in); err != nil {
		return fmt.Errorf("%s: copy %s: %w", what, src, err)
	}
	if got := digest.NewDigest(digest.SHA256, h).String(); got != d {
		return fmt.Errorf("%s: %w: %s hashes to %s; the boot loader goes back to the release before once this entry's tries run out", what, contract.ErrDamaged, src, got)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		return fmt.Errorf("%s: seal: %w", what, err)
	}
	if err := unix.Fchmod(fd, 0o500); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// Not close-on-exec: the kernel opens /proc/self/fd/N as it execs, and
	// an interpreter (a script) opens it after.
	err = unix.Exec(fmt.Sprintf("/proc/self/fd/%d", fd), args, append(os.Environ(), Env+"="+d))
	return fmt.Errorf("%s: exec: %w", what, err)
}
