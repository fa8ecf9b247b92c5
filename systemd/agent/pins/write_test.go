package pins

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// helperEnv makes the test binary write pins and stop just before the
// rename (a real process for the tests to kill at that step).
const helperEnv = "KILN_PINS_TEST_WRITE"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		err := write(path, images, atomicfile.BeforeRename(func(tmp string) {
			fmt.Println(tmp)
			time.Sleep(time.Hour) // killed here
		}))
		fmt.Fprintln(os.Stderr, "write returned:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// parsePins reads pinned_images from a drop-in, as CRI-O would, and fails
// on keys CRI-O would not know.
func parsePins(t *testing.T, path string) []string {
	t.Helper()
	got, err := contract.ReadPins(path) // strict: a key CRI-O would not know is an error
	if err != nil {
		t.Fatalf("%s is not a pins drop-in CRI-O can read: %v", path, err)
	}
	return got
}

// TestKilledBeforeRename (audit row 7): write-pins SIGKILLed between write
// and rename leaves its temp file outside crio.conf.d, so what CRI-O reads
// is the old drop-in, whole; the next write removes the temp file.
func TestKilledBeforeRename(t *testing.T) {
	crio := t.TempDir()                                             // /etc/crio
	path := filepath.Join(crio, "crio.conf.d", "50-kiln-pins.conf") // what CRI-O reads
	if err := Write(path, images[:1]); err != nil {
		t.Fatal(err)
	}
	old := parsePins(t, path)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tmp, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		t.Fatalf("the writer did not reach the rename: %v", err)
	}
	tmp = strings.TrimSpace(tmp)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	if filepath.Dir(tmp) != crio {
		t.Errorf("temp file %s is not in %s", tmp, crio)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("the killed writer left no temp file (%v): the test did not stop it at the step", err)
	}
	// CRI-O parses every file of crio.conf.d: only the old drop-in is there.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 || ents[0].Name() != filepath.Base(path) {
		t.Errorf("crio.conf.d holds %v, want only %s", ents, filepath.Base(path))
	}
	if got := parsePins(t, path); strings.Join(got, " ") != strings.Join(old, " ") {
		t.Errorf("after the kill CRI-O reads %v, want the old pins %v", got, old)
	}

	// The next run cleans up and writes.
	if err := Write(path, images); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("the next write left the abandoned temp file %s (%v)", tmp, err)
	}
	if got := parsePins(t, path); len(got) != 6 {
		t.Errorf("after the next write: %v", got)
	}
	for _, d := range []string{crio, filepath.Dir(path)} {
		if m, _ := filepath.Glob(filepath.Join(d, ".*tmp-*")); len(m) > 0 {
			t.Errorf("temp files left in %s: %v", d, m)
		}
	}
}
