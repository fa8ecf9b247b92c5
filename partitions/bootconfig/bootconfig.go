// Package bootconfig puts the Ignition config into the boot partition of a
// disk image, where coreos-installer puts it and Ignition's "metal" platform
// looks for it, and reads it back: without mounting, through debugfs on the
// ext4 filesystem inside the disk file, every timestamp the build's.
package bootconfig

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kiln-appliance/kiln/internal/hosttools"
	"github.com/kiln-appliance/kiln/partitions/gpt"
)

// IgnitionPath is where coreos-installer puts the Ignition config in the boot
// partition, and where Ignition's "metal" platform looks for it.
const IgnitionPath = "ignition/config.ign"

// Partition is the GPT name (or filesystem label) of the partition that
// receives the Ignition config.
const Partition = "boot"

// Write writes config as /ignition/config.ign into the ext4
// filesystem at offset in disk, replacing any file already there, without
// mounting: debugfs opens the filesystem inside the disk file through the
// unix I/O manager's "?offset=" option. E2FSPROGS_FAKE_TIME makes every
// timestamp debugfs writes (inodes, superblock) SOURCE_DATE_EPOCH, so the
// result is reproducible. The config goes through a temporary directory in
// tempDir ("": $TMPDIR).
func Write(disk string, offset int64, config []byte, epoch int64, tempDir string) error {
	dir, err := os.MkdirTemp(tempDir, "kiln-ignition-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "config.ign")
	if err := os.WriteFile(src, config, 0o600); err != nil {
		return err
	}
	// debugfs mkdir on an existing name leaks a directory inode (e2fsck then
	// finds an unconnected directory), so look before acting. debugfs also
	// keeps going after a failed command and exits 0: the read-back below is
	// what decides success.
	spec := fsSpec(disk, offset)
	dirType, err := debugfsType(spec, "/ignition")
	if err != nil {
		return err
	}
	var script []string
	switch dirType {
	case "":
		// Modes as coreos-installer sets them: the config may hold secrets.
		script = append(script, "mkdir /ignition", "sif /ignition mode 040700", "cd /ignition")
	case "directory":
		fileType, err := debugfsType(spec, "/"+IgnitionPath)
		if err != nil {
			return err
		}
		script = append(script, "cd /ignition")
		if fileType != "" {
			script = append(script, "rm config.ign")
		}
	default:
		return fmt.Errorf("the %s partition has /ignition, but it is a %s, not a directory: remove it from the base image", Partition, dirType)
	}
	script = append(script,
		"write "+src+" config.ign",
		"sif /"+IgnitionPath+" mode 0100600",
		"sif /"+IgnitionPath+" uid 0",
		"sif /"+IgnitionPath+" gid 0",
		"")
	cmds := filepath.Join(dir, "cmds")
	if err := os.WriteFile(cmds, []byte(strings.Join(script, "\n")), 0o600); err != nil {
		return err
	}
	cmd := exec.Command("debugfs", "-w", "-f", cmds, spec)
	// e2fsprogs reads a fake time of 0 as unset and stamps the clock's, so
	// SOURCE_DATE_EPOCH=0 (a common choice) is written as one second past
	// it: the disk stays reproducible.
	// (An earlier E2FSPROGS_FAKE_TIME in the environment: the last one wins.)
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME="+strconv.FormatInt(max(epoch, 1), 10))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return hosttools.RunError("write Ignition config with debugfs", err, out)
	}
	got, err := readIgnition(disk, offset)
	if err != nil || !bytes.Equal(got, config) {
		return fmt.Errorf("write Ignition config into the %s partition failed (is /ignition a directory? is the filesystem full?); debugfs said: %s", Partition, bytes.TrimSpace(out))
	}
	return nil
}

// debugfsType returns the type of path in the filesystem ("regular",
// "directory", …) or "" if there is none.
func debugfsType(spec, path string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("debugfs", "-R", "stat "+path, spec)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", hosttools.RunError("debugfs stat "+path, err, stderr.Bytes())
	}
	if strings.Contains(stderr.String(), "File not found") {
		return "", nil
	}
	if msg := debugfsError(stderr.Bytes()); msg != "" {
		return "", fmt.Errorf("debugfs stat %s: %s", path, msg)
	}
	// "Inode: 12   Type: directory    Mode:  0755   Flags: 0x80000"
	out := stdout.String()
	k := strings.Index(out, "Type: ")
	if k < 0 {
		return "", fmt.Errorf("debugfs stat %s: unexpected output %q", path, out)
	}
	fields := strings.Fields(out[k+len("Type: "):])
	if len(fields) == 0 {
		return "", fmt.Errorf("debugfs stat %s: unexpected output %q", path, out)
	}
	if fields[0] == "regular" {
		return "regular file", nil
	}
	return fields[0], nil
}

// fsSpec names a filesystem inside a disk file for e2fsprogs.
func fsSpec(disk string, offset int64) string {
	return disk + "?offset=" + strconv.FormatInt(offset, 10)
}

func readIgnition(disk string, offset int64) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("debugfs", "-R", "cat /"+IgnitionPath, fsSpec(disk, offset))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, hosttools.RunError("debugfs cat /"+IgnitionPath, err, stderr.Bytes())
	}
	// debugfs prints its banner on stderr and a lookup error there too.
	if msg := debugfsError(stderr.Bytes()); msg != "" {
		return nil, fmt.Errorf("read /%s from the %s partition: %s", IgnitionPath, Partition, msg)
	}
	return stdout.Bytes(), nil
}

// debugfsError returns debugfs's error lines (everything but its banner).
func debugfsError(stderr []byte) string {
	var msgs []string
	for _, line := range strings.Split(string(stderr), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "debugfs ") {
			continue
		}
		msgs = append(msgs, line)
	}
	return strings.Join(msgs, "; ")
}

// Read returns the Ignition config in the boot partition of the disk
// image at path. It needs only read access.
func Read(path string) ([]byte, error) {
	l, err := gpt.Inspect(path)
	if err != nil {
		return nil, err
	}
	p, err := Find(l)
	if err != nil {
		return nil, fmt.Errorf("disk %s: %w", path, err)
	}
	return readIgnition(path, p.Offset)
}

// Find finds the partition of l the Ignition config goes into, and
// refuses one that holds no ext4 filesystem.
func Find(l *gpt.Layout) (*gpt.Partition, error) {
	p, ok := l.Find(Partition)
	if !ok {
		return nil, fmt.Errorf("no partition named or labelled %q (partitions: %s); kiln writes the Ignition config there, as coreos-installer does: use a CoreOS-like base image (docs/base.md says what it must have)", Partition, l.Names())
	}
	if p.Filesystem != gpt.FSExt4 {
		fsName := p.Filesystem
		if fsName == "" {
			fsName = "an unknown filesystem"
		}
		return nil, fmt.Errorf("partition %d %q holds %s; kiln can write the Ignition config only into ext4", p.Number, p.Name, fsName)
	}
	return p, nil
}
