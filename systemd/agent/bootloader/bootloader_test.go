package bootloader

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unicode/utf16"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

func entry(version string) bootentry.Entry {
	return bootentry.Entry{ID: "kiln-" + version, Title: "kiln " + version, Version: version,
		Linux: "/kiln/" + version + "/vmlinuz", Initrd: []string{"/kiln/" + version + "/initrd.img"},
		Options: []string{"root=LABEL=root", "rw"}}
}

func esp(t *testing.T, files ...string) string {
	t.Helper()
	d := t.TempDir()
	os.MkdirAll(filepath.Join(d, bootentry.Dir), 0o755)
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(d, bootentry.Dir, f), []byte("title old\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func names(t *testing.T, esp string) string {
	t.Helper()
	ns, err := Entries(esp)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, n := range ns {
		s = append(s, n.String())
	}
	return strings.Join(s, " ")
}

func TestInstall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before []string
		tries  int
		want   string
	}{
		{"a new release, tried", []string{"kiln-1.0.0.conf"}, 3, "kiln-1.0.0.conf kiln-1.1.0+3.conf"},
		{"a release that ran out of tries, tried again", []string{"kiln-1.0.0.conf", "kiln-1.1.0+0-3.conf", ".kiln-1.1.0.conf.tmp", "README"}, 3, "kiln-1.0.0.conf kiln-1.1.0+3.conf"},
		{"the factory's release, good from the start", nil, 0, "kiln-1.1.0.conf"},
		{"written twice", []string{"kiln-1.1.0+3.conf"}, 3, "kiln-1.1.0+3.conf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := esp(t, tc.before...)
			if err := Install(d, entry("1.1.0"), tc.tries); err != nil {
				t.Fatal(err)
			}
			if got := names(t, d); got != tc.want {
				t.Errorf("entries %q, want %q", got, tc.want)
			}
			b, err := os.ReadFile(filepath.Join(d, bootentry.Dir, bootentry.FileName("kiln-1.1.0", tc.tries)))
			if err != nil || !strings.Contains(string(b), "linux /kiln/1.1.0/vmlinuz\n") {
				t.Errorf("the entry reads %q (%v)", b, err)
			}
		})
	}
	if err := Install(esp(t), bootentry.Entry{ID: "kiln+1"}, 3); err == nil {
		t.Error("Install wrote an entry Check refuses")
	}
}

func TestRemove(t *testing.T) {
	d := esp(t, "kiln-1.0.0.conf", "kiln-1.1.0+0-3.conf", "kiln-1.1.0.conf")
	if err := Remove(d, "kiln-1.1.0"); err != nil {
		t.Fatal(err)
	}
	if got := names(t, d); got != "kiln-1.0.0.conf" {
		t.Errorf("entries %q after removing 1.1.0", got)
	}
}

const helperEnv = "KILN_TEST_BOOTLOADER_KILL"

func init() {
	if d := os.Getenv(helperEnv); d != "" {
		Install(d, entry("1.1.0"), 3, atomicfile.BeforeRename(func(tmp string) {
			fmt.Println(tmp)
			select {} // killed here
		}))
		os.Exit(3)
	}
}

// A power cut while the entry is written leaves the ESP as it was: no file
// systemd-boot reads is half-written, and the next Install finishes.
func TestKilledBeforeRename(t *testing.T) {
	d := esp(t, "kiln-1.0.0.conf", "kiln-1.1.0+0-3.conf")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+d)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tmp, err := bufio.NewReader(out).ReadString('\n')
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if err != nil {
		t.Fatalf("the writer did not reach the rename: %v", err)
	}
	if dir := filepath.Dir(strings.TrimSpace(tmp)); dir == filepath.Join(d, bootentry.Dir) {
		t.Errorf("the temp file %s is among the entries", tmp)
	}
	if got := names(t, d); got != "kiln-1.0.0.conf kiln-1.1.0+0-3.conf" {
		t.Errorf("after the kill: %q, want the entries as they were", got)
	}
	if err := Install(d, entry("1.1.0"), 3); err != nil {
		t.Fatal(err)
	}
	if got := names(t, d); got != "kiln-1.0.0.conf kiln-1.1.0+3.conf" {
		t.Errorf("after the next Install: %q", got)
	}
}

func efivar(t *testing.T, dir, name, value string) {
	t.Helper()
	b := []byte{7, 0, 0, 0}
	for _, c := range utf16.Encode([]rune(value + "\x00")) {
		b = append(b, byte(c), byte(c>>8))
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-"+loaderVendor), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBooted(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"kiln-1.1.0.conf", "kiln-1.1.0"},
		{"kiln-1.1.0+2-1.conf", "kiln-1.1.0"},
		{"kiln-1.1.0", "kiln-1.1.0"},
		{"kiln-1.1.0+3.efi", "kiln-1.1.0"}, // a type #2 entry: its file name
		{"kiln-1.0.efi", "kiln-1.0"},
	} {
		d := t.TempDir()
		efivar(t, d, "LoaderEntrySelected", tc.value)
		if got, err := Booted(d); err != nil || got != tc.want {
			t.Errorf("Booted with %q = %q, %v; want %q", tc.value, got, err, tc.want)
		}
	}
	if got, err := Booted(t.TempDir()); got != "" || err != nil {
		t.Errorf("no variable: %q, %v", got, err)
	}
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "LoaderEntrySelected-"+loaderVendor), []byte{7, 0, 0}, 0o644)
	if _, err := Booted(d); err == nil {
		t.Error("a damaged variable was read")
	}
}

func TestBootFiles(t *testing.T) {
	d := esp(t)
	kernel := []byte("a kernel")
	sum := fmt.Sprintf("sha256:%x", sha256.Sum256(kernel))
	if err := WriteBootFile(d, sum, int64(len(kernel)), strings.NewReader("another kernel")); !errors.Is(err, contract.ErrDamaged) {
		t.Errorf("wrong bytes: %v, want contract.ErrDamaged", err)
	}
	if ok, _ := HasBootFile(d, sum); ok {
		t.Error("a damaged copy is in place")
	}
	if err := WriteBootFile(d, sum, int64(len(kernel)), strings.NewReader(string(kernel))); err != nil {
		t.Fatal(err)
	}
	if ok, err := HasBootFile(d, sum); !ok || err != nil {
		t.Errorf("HasBootFile %v %v", ok, err)
	}
	if p, err := FindFile(d, sum, int64(len(kernel))); p != "" || err != nil {
		t.Errorf("FindFile found %q (%v) though no entry boots it", p, err)
	}
	e := entry("1.1.0")
	e.Linux = BootFilePath(sum)
	if err := Install(d, e, 3); err != nil {
		t.Fatal(err)
	}
	if p, err := FindFile(d, sum, int64(len(kernel))); p == "" || err != nil {
		t.Errorf("FindFile: %q %v", p, err)
	}
	os.WriteFile(filepath.Join(d, BootFileDir, "0123"), []byte("left by a cut import"), 0o644)
	os.WriteFile(filepath.Join(d, BootFileDir, ".0123.tmp-99"), []byte("a killed writer's"), 0o644)
	gone, err := RemoveUnusedBootFiles(d)
	if err != nil || strings.Join(gone, " ") != ".0123.tmp-99 0123" {
		t.Errorf("removed %q (%v)", gone, err)
	}
	if ok, _ := HasBootFile(d, sum); !ok {
		t.Error("the file an entry boots was removed")
	}
	Remove(d, e.ID)
	if gone, _ := RemoveUnusedBootFiles(d); len(gone) != 1 {
		t.Errorf("once no entry boots it: removed %q", gone)
	}
}

// RemoveWithFiles removes the entry and the boot files only it booted; a
// file another entry boots stays, and a path out of the ESP is never
// followed.
func TestRemoveWithFiles(t *testing.T) {
	d := esp(t)
	for _, f := range []string{"kiln/1.0/vmlinuz", "kiln/1.0/initrd.img", "kiln/shared/vmlinuz"} {
		os.MkdirAll(filepath.Join(d, filepath.Dir(f)), 0o755)
		os.WriteFile(filepath.Join(d, f), []byte(f), 0o644)
	}
	outside := filepath.Join(filepath.Dir(d), "outside")
	os.WriteFile(outside, []byte("not the ESP's"), 0o644)
	old := entry("1.0")
	old.Linux, old.Initrd = "/kiln/shared/vmlinuz", []string{"/kiln/1.0/initrd.img", "/../outside"}
	other := entry("1.1.0")
	other.Linux, other.Initrd = "/kiln/shared/vmlinuz", nil
	var b strings.Builder
	old.Initrd = old.Initrd[:1]
	old.Encode(&b)
	os.WriteFile(filepath.Join(d, bootentry.Dir, "kiln-1.0+0-3.conf"), []byte(b.String()+"initrd /../outside\n"), 0o644)
	if err := Install(d, other, 0); err != nil {
		t.Fatal(err)
	}
	gone, err := RemoveWithFiles(d, "kiln-1.0")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(gone, " ") != "/kiln/1.0/initrd.img" {
		t.Errorf("removed %q", gone)
	}
	if names(t, d) != "kiln-1.1.0.conf" {
		t.Errorf("entries %q", names(t, d))
	}
	for f, want := range map[string]bool{filepath.Join(d, "kiln/shared/vmlinuz"): true, filepath.Join(d, "kiln/1.0/initrd.img"): false, filepath.Join(d, "kiln/1.0/vmlinuz"): true, outside: true} {
		if _, err := os.Stat(f); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", f, err == nil, want)
		}
	}
}

// A type #2 entry: the checked image renamed into EFI/Linux with tries
// left, the entry's older files of both kinds removed, listed beside the
// type #1 entries and removed by its ID like them.
func TestInstallUKI(t *testing.T) {
	d := esp(t, "kiln-1.0.conf")
	linux := filepath.Join(d, filepath.FromSlash(bootentry.UKIDir))
	os.MkdirAll(linux, 0o755)
	os.WriteFile(filepath.Join(linux, "kiln-1.1.0+0-3.efi"), []byte("an older try"), 0o644)
	os.WriteFile(filepath.Join(linux, "notes.txt"), []byte("not an entry"), 0o644)
	src := filepath.Join(d, filepath.FromSlash(bootentry.FilePath("sha256:"+strings.Repeat("ab", 32))))
	os.MkdirAll(filepath.Dir(src), 0o755)
	os.WriteFile(src, []byte("a signed image"), 0o644)
	if err := InstallUKI(d, "kiln-1.1.0", src, 3); err != nil {
		t.Fatal(err)
	}
	if got := names(t, d); got != "kiln-1.1.0+3.efi kiln-1.0.conf" {
		t.Errorf("entries %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(linux, "kiln-1.1.0+3.efi")); string(b) != "a signed image" {
		t.Errorf("the entry holds %q", b)
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Errorf("the image is still at %s: %v", src, err)
	}
	if n, ok, err := Find(d, "kiln-1.1.0"); !ok || err != nil || !n.UKI || n.Left != 3 {
		t.Errorf("Find: %+v %v %v", n, ok, err)
	}
	if err := Remove(d, "kiln-1.1.0"); err != nil {
		t.Fatal(err)
	}
	if got := names(t, d); got != "kiln-1.0.conf" {
		t.Errorf("after Remove: %q", got)
	}
	if err := InstallUKI(d, "kiln-1.1.0", src, 3); err == nil {
		t.Error("an image that is not there was installed")
	}
}
