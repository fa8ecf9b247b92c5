package gate

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// Real c/image (Debian's podman) reads the drop-in the gate writes, from the
// real drop-in directory, and pulls through the mirror while the upstream is
// dead: quay.io resolves to 127.0.0.1, where nothing listens on 443. Run in a
// private mount namespace so the host's /etc is never touched.
func TestPodmanPullsThroughMirror(t *testing.T) {
	addr := serve(t, "127.0.0.1:0", registry.New(registry.Logger(nopLogger())))
	img := push(t, addr)
	d, _ := img.Digest()

	tests := []struct {
		name       string
		mirrorTags bool
		ref        string
		wantOK     bool
	}{
		{"digest pull, digest-only", false, "quay.io/acme/app@" + d.String(), true},
		// Proves podman's c/image honours pull-from-mirror: a tag pull must
		// skip the mirror and fail on the dead upstream.
		{"tag pull, digest-only", false, "quay.io/acme/app:1.2", false},
		{"tag pull, all", true, "quay.io/acme/app:1.2", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(t, contents(t, addr, img, tt.mirrorTags))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := g.Open(ctx); err != nil {
				t.Fatal(err)
			}
			out, err := podmanPull(t, filepath.Dir(g.DropIn), tt.ref)
			if tt.wantOK && err != nil {
				t.Fatalf("podman pull %s through the mirror: %v\n%s\ndrop-in:\n%s", tt.ref, err, out, g.DropInContents())
			}
			// The refusal must come from the dead upstream, not from a
			// config podman could not read.
			if !tt.wantOK && (err == nil || !strings.Contains(out, "quay.io") || !strings.Contains(out, "connection refused")) {
				t.Fatalf("podman pull %s: %v, want it to bypass the mirror and fail on the dead upstream:\n%s", tt.ref, err, out)
			}
			t.Logf("podman pull %s:\n%s", tt.ref, out)
		})
	}
}

// podmanPull runs podman pull with dropInDir as /etc/containers/registries.conf.d,
// a minimal registries.conf, and quay.io pointed at a dead address, in a
// throwaway store.
func podmanPull(t *testing.T, dropInDir, ref string) (string, error) {
	t.Helper()
	// podman refuses a runroot longer than 50 characters: keep it short.
	tmp, err := os.MkdirTemp("", "kgate")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	conf := filepath.Join(tmp, "registries.conf")
	hosts := filepath.Join(tmp, "hosts")
	must(t, os.WriteFile(conf, []byte("unqualified-search-registries = []\n"), 0o644))
	must(t, os.WriteFile(hosts, []byte("127.0.0.1 localhost quay.io\n"), 0o644))
	script := `set -e
mount --bind "$DROPIN" /etc/containers/registries.conf.d
mount --bind "$CONF" /etc/containers/registries.conf
mount --bind "$HOSTS" /etc/hosts
exec podman --root "$TMP/root" --runroot "$TMP/run" --storage-driver vfs pull "$REF"`
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "DROPIN="+dropInDir, "CONF="+conf, "HOSTS="+hosts, "TMP="+tmp, "REF="+ref)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
