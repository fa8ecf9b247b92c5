package crio

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/containers/image/v5/pkg/sysregistriesv2"
	"github.com/cri-o/cri-o/pkg/config"
	"github.com/sirupsen/logrus"
)

// kiln's rendered node files, from the golden files its own tests keep equal
// to what the renderers write (systemd/units, systemd/agent/gate): this
// module cannot import kiln (see doc.go), so it reads what kiln renders.
const (
	unitsGolden = "../../systemd/units/testdata/preload-store.golden"
	gateGolden  = "../../systemd/agent/gate/testdata/dropin.golden"
	crioConf    = "../e2e/fixture/files/crio.conf" // the e2e node's crio.conf

	pinsPath        = "/etc/crio/crio.conf.d/50-kiln-pins.conf"
	storageConfPath = "/etc/containers/storage.conf"
	storePath       = "/var/lib/kiln/images/storage" // the preloaded store
)

// wantPins: what the golden's images (quay.io/acme/app:1.2 and nginx, see
// systemd/units/render_test.go) must be pinned as, by digest and by name.
var wantPins = []string{
	"docker.io/library/nginx:latest",
	"docker.io/library/nginx@sha256:" + strings.Repeat("b", 64),
	"quay.io/acme/app:1.2",
	"quay.io/acme/app@sha256:" + strings.Repeat("a", 64),
}

// storageConfEnv names the storage.conf a re-executed test binary loads
// instead of kiln's (see TestMain).
const storageConfEnv = "KILN_TEST_STORAGE_CONF"

// TestMain points containers/storage (as CRI-O's DefaultConfig loads it) at
// the storage.conf kiln renders, before anything reads it: c/storage loads
// it once per process.
func TestMain(m *testing.M) {
	conf := os.Getenv(storageConfEnv)
	if conf == "" {
		b, err := section(unitsGolden, "file "+storageConfPath)
		if err != nil {
			panic(err)
		}
		dir, err := os.MkdirTemp("", "kiln-crio-")
		if err != nil {
			panic(err)
		}
		defer os.RemoveAll(dir)
		conf = filepath.Join(dir, "storage.conf")
		if err := os.WriteFile(conf, b, 0o644); err != nil {
			panic(err)
		}
	}
	os.Setenv("CONTAINERS_STORAGE_CONF", conf)
	logrus.AddHook(warnings)
	code := m.Run()
	os.Exit(code)
}

// section returns the body of the golden file's "### <header> ..." section.
func section(golden, header string) ([]byte, error) {
	b, err := os.ReadFile(golden)
	if err != nil {
		return nil, err
	}
	for _, part := range strings.Split("\n"+string(b), "\n### ")[1:] {
		first, body, _ := strings.Cut(part, "\n")
		if first == header || strings.HasPrefix(first, header+" ") {
			return []byte(body), nil
		}
	}
	return nil, &os.PathError{Op: "find section " + header, Path: golden, Err: os.ErrNotExist}
}

func mustSection(t *testing.T, golden, header string) []byte {
	t.Helper()
	b, err := section(golden, header)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// warnings records what CRI-O and containers/storage log at warning level
// or worse: an unknown key in storage.conf is only a warning there.
var warnings = &warnHook{}

type warnHook struct {
	mu   sync.Mutex
	msgs []string
}

func (h *warnHook) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

func (h *warnHook) Fire(e *logrus.Entry) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, e.Message)
	return nil
}

func (h *warnHook) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.msgs
	h.msgs = nil
	return m
}

// writeTemp writes b to a file named name in a new temp dir.
func writeTemp(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// defaultConfig is CRI-O's DefaultConfig, failing the test on warnings.
func defaultConfig(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.DefaultConfig()
	if err != nil {
		t.Fatalf("CRI-O DefaultConfig (reads storage.conf): %v", err)
	}
	if w := warnings.take(); len(w) > 0 {
		t.Fatalf("CRI-O / containers/storage warned while loading the defaults: %q", w)
	}
	return c
}

// The pin drop-in, loaded the way CRI-O loads /etc/crio/crio.conf.d, pins
// every image by repo@digest and by name, with nothing else.
func TestPinDropIn(t *testing.T) {
	pinConf := mustSection(t, unitsGolden, "file "+pinsPath)
	c := defaultConfig(t)
	if err := c.UpdateFromDropInFile(context.Background(), writeTemp(t, "50-kiln-pins.conf", pinConf)); err != nil {
		t.Fatalf("CRI-O refuses kiln's pin drop-in: %v\n%s", err, pinConf)
	}
	got := slices.Clone(c.PinnedImages)
	sort.Strings(got)
	if !slices.Equal(got, wantPins) {
		t.Fatalf("CRI-O's pinned_images from kiln's drop-in:\n got  %q\n want %q\nfile:\n%s", got, wantPins, pinConf)
	}
	for _, p := range got {
		// Exact patterns only: CRI-O treats a trailing '*' as a prefix
		// glob and '*…*' as a keyword.
		if strings.Contains(p, "*") {
			t.Errorf("pin %q is a glob; kiln pins exact references", p)
		}
	}
	// The e2e node's crio.conf with the pin drop-in on top still validates
	// (CRI-O's start-up checks, minus those that need the node itself).
	if err := c.UpdateFromFile(context.Background(), crioConf); err != nil {
		t.Fatalf("%s: %v", crioConf, err)
	}
	if err := c.UpdateFromDropInFile(context.Background(), writeTemp(t, "50-kiln-pins.conf", pinConf)); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(false); err != nil {
		t.Fatalf("CRI-O Validate with %s and kiln's pins: %v", crioConf, err)
	}
	if len(c.PinnedImages) != len(wantPins) {
		t.Errorf("pins after crio.conf + drop-in: %q", c.PinnedImages)
	}
}

// A pin file CRI-O cannot parse is an error here, not only on the node.
func TestPinDropInRefusesBrokenFile(t *testing.T) {
	c := defaultConfig(t)
	broken := writeTemp(t, "50-kiln-pins.conf", []byte("[crio.image]\npinned_images = [\"quay.io/a:1\"\n"))
	if err := c.UpdateFromDropInFile(context.Background(), broken); err == nil {
		t.Fatal("CRI-O accepted a pin drop-in with an unclosed array")
	}
}

// storage.conf (store mode), as CRI-O reads it through containers/storage's
// defaults: overlay, the usual roots, and the preloaded store on the image
// partition as an additional image store.
func TestStorageConf(t *testing.T) {
	c := defaultConfig(t)
	if c.Storage != "overlay" {
		t.Errorf("storage driver %q, want overlay", c.Storage)
	}
	if c.Root != "/var/lib/containers/storage" || c.RunRoot != "/run/containers/storage" {
		t.Errorf("roots %q %q, want /var/lib/containers/storage /run/containers/storage", c.Root, c.RunRoot)
	}
	for _, want := range []string{"overlay.imagestore=" + storePath, "overlay.mountopt=nodev"} {
		if !slices.Contains(c.StorageOptions, want) {
			t.Errorf("CRI-O storage options %q lack %q", c.StorageOptions, want)
		}
	}
}

// The storage.conf check can fail: with a misspelt key, containers/storage
// only warns (and drops the setting); the test fails on that warning.
// Re-executes this test binary: c/storage reads storage.conf once per process.
func TestStorageConfMisspeltKeyFails(t *testing.T) {
	if os.Getenv(storageConfEnv) != "" {
		t.Skip("this is the re-executed run")
	}
	good := string(mustSection(t, unitsGolden, "file "+storageConfPath))
	bad := strings.Replace(good, "additionalimagestores =", "additionalimagestore =", 1)
	if bad == good {
		t.Fatal("kiln's storage.conf has no additionalimagestores key")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStorageConf$", "-test.count=1")
	cmd.Env = append(os.Environ(), storageConfEnv+"="+writeTemp(t, "storage.conf", []byte(bad)))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "additionalimagestore") {
		t.Fatalf("CRI-O's view of a storage.conf with a misspelt key passed (err %v):\n%s", err, out)
	}
}

// The mirror drop-in, loaded as CRI-O loads registries.conf.d (its
// SystemContext, reloaded with ReloadRegistries as on SIGHUP): every
// mirrored host gets the node's registry as its one insecure mirror, with
// the pull-from-mirror mode the gate wrote.
func TestMirrorDropIn(t *testing.T) {
	for _, tt := range []struct {
		section string
		mode    string
	}{
		{"mirrorTags=true", sysregistriesv2.MirrorAll},
		{"mirrorTags=false", sysregistriesv2.MirrorByDigestOnly},
	} {
		t.Run(tt.section, func(t *testing.T) {
			dropIn := mustSection(t, gateGolden, tt.section)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "50-kiln-mirror.conf"), dropIn, 0o644); err != nil {
				t.Fatal(err)
			}
			c := defaultConfig(t)
			c.SystemContext.SystemRegistriesConfPath = writeTemp(t, "registries.conf", []byte("unqualified-search-registries = []\n"))
			c.SystemContext.SystemRegistriesConfDirPath = dir
			if err := c.ReloadRegistries(); err != nil {
				t.Fatalf("CRI-O refuses kiln's mirror drop-in: %v\n%s", err, dropIn)
			}
			for _, host := range []string{"docker.io", "quay.io", "registry.example.com"} {
				r, err := sysregistriesv2.FindRegistry(c.SystemContext, host+"/acme/app:1.2")
				if err != nil || r == nil {
					t.Fatalf("no registries.conf entry for %s: %v", host, err)
				}
				if len(r.Mirrors) != 1 {
					t.Fatalf("%s: mirrors %+v, want exactly the node's registry", host, r.Mirrors)
				}
				m := r.Mirrors[0]
				if m.Location != "127.0.0.1:5050/"+host || !m.Insecure || m.PullFromMirror != tt.mode {
					t.Errorf("%s: mirror %+v, want 127.0.0.1:5050/%s, insecure, pull-from-mirror %s", host, m, host, tt.mode)
				}
			}
			// Not mirrored: hosts of images that are not served.
			if r, _ := sysregistriesv2.FindRegistry(c.SystemContext, "ghcr.io/acme/preloaded-only:1"); r != nil {
				t.Errorf("ghcr.io is not served, yet has entry %+v", r)
			}
			if w := warnings.take(); len(w) > 0 {
				t.Errorf("warnings while loading the mirror drop-in: %q", w)
			}
		})
	}
}
