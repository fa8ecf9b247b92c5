package release

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/systemd/contract"
)

// The life of a node: factory 1.0, upgrades to 1.1 and 1.2 confirmed, 1.3
// rolled back, staged again as a retry and abandoned. After every step the node is at rest
// and consistent, and running the step again changes nothing.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	steps := []struct {
		op       op
		versions string // current/previous/staged/trying after it
		removed  string // images the remover was asked to remove so far
	}{
		{op{Action: "init"}, "1.0.0/-/-/-", ""},
		{op{Action: "stage", Version: "1.1.0"}, "1.0.0/-/1.1.0/-", ""},
		{op{Action: "begin", Boot: "b1"}, "1.0.0/-/-/1.1.0", ""},
		{op{Action: "confirm", Version: "1.1.0"}, "1.1.0/1.0.0/-/-", ""},
		{op{Action: "stage", Version: "1.2.0"}, "1.1.0/1.0.0/1.2.0/-", ""},
		{op{Action: "begin", Boot: "b2"}, "1.1.0/1.0.0/-/1.2.0", ""},
		{op{Action: "confirm", Version: "1.2.0"}, "1.2.0/1.1.0/-/-", "quay.io/acme/app:1.0"},
		{op{Action: "stage", Version: "1.3.0"}, "1.2.0/1.1.0/1.3.0/-", "quay.io/acme/app:1.0"},
		{op{Action: "begin", Boot: "b3"}, "1.2.0/1.1.0/-/1.3.0", "quay.io/acme/app:1.0"},
		{op{Action: "rollback", Version: "1.3.0"}, "1.2.0/1.1.0/-/-", "quay.io/acme/app:1.0 quay.io/acme/app:1.3"},
		{op{Action: "retry", Version: "1.3.0"}, "1.2.0/1.1.0/1.3.0/-", "quay.io/acme/app:1.0 quay.io/acme/app:1.3"},
		{op{Action: "abandon", Version: "1.3.0"}, "1.2.0/1.1.0/-/-", "quay.io/acme/app:1.0 quay.io/acme/app:1.3 quay.io/acme/app:1.3"},
	}
	for _, st := range steps {
		if st.op.Action == "stage" || st.op.Action == "retry" {
			testReleases[st.op.Version].importBlobs(t, n.root)
		}
		s, err := n.run(t, n.machine(st.op.Boot), st.op)
		if err != nil {
			t.Fatalf("%s: %v", st.op, err)
		}
		if got := versions(s); got != st.versions {
			t.Errorf("after %s: %s, want %s", st.op, got, st.versions)
		}
		n.checkConverged(t)
		removed, _ := os.ReadFile(n.removedLog())
		if got := strings.Join(strings.Fields(string(removed)), " "); got != st.removed {
			t.Errorf("after %s: images removed: %q, want %q", st.op, got, st.removed)
		}
		// Again: nothing changes, CRI-O is not bothered.
		os.Remove(n.crioView())
		before := n.snapshot(t)
		if _, err := n.run(t, n.machine(st.op.Boot), st.op); err != nil {
			t.Errorf("%s again: %v", st.op, err)
		}
		if d := diffSnapshots(before, n.snapshot(t)); d != "" {
			t.Errorf("%s again changed the node:\n%s", st.op, d)
		}
		if _, err := os.Stat(n.crioView()); err == nil {
			t.Errorf("%s again told CRI-O to reload pins that did not change", st.op)
		}
		if err := os.WriteFile(n.crioView(), mustRead(t, filepath.Join(n.root, contract.PinsDropIn)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := n.machine("").Load()
	if s.Last == nil || s.Last.Action != "abandon" || s.Last.Version != "1.3.0" || !s.Last.OK {
		t.Errorf("last result %+v", s.Last)
	}
	if len(s.Failed) != 1 || s.Failed[0].Version != "1.3.0" {
		t.Errorf("failed %+v: 1.3's rollback must be kept after the retry and the abandon", s.Failed)
	}
}

// A release rolled back on this node (its health check, kiln's boot count)
// is refused when it is imported again, saying when and why, and changing
// nothing; a deliberate retry stages it, and the failure stays recorded
// (and in the status) until a release is confirmed.
func TestFailedBefore(t *testing.T) {
	t.Parallel()
	at := func(sec int64) Option { return WithClock(func() time.Time { return time.Unix(sec, 0) }) }
	const healthFailed = "release 1.1.0 failed on this node before: rolled back on 2023-11-14 22:13:20 UTC: health check failed: app.service is not active"
	rolledBack := []op{{Action: "init"}, {Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"},
		{Action: "begin", Boot: "b1"}, {Action: "rollback", Version: "1.1.0"}}
	notConfirmed := []op{{Action: "init"}, {Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"},
		{Action: "begin", Boot: "b1"}, {Action: "begin", Boot: "b2"}, {Action: "begin", Boot: "b3"}, {Action: "begin", Boot: "b4"}}
	for _, tc := range []struct {
		name    string
		setup   []op
		then    []op   // after the refusal is checked
		refused string // the release a stage of 1.1.0 is refused for, and why
		failed  string // version: message of each failure in the state after then
		last    string
	}{
		{"health check failed", rolledBack, nil, healthFailed,
			"1.1.0: health check failed: app.service is not active", "rollback 1.1.0"},
		{"not confirmed after 3 boots", notConfirmed, nil,
			"release 1.1.0 failed on this node before: rolled back on 2023-11-14 22:13:20 UTC: not confirmed healthy after 3 boots",
			"1.1.0: not confirmed healthy after 3 boots", "rollback 1.1.0"},
		{"retried: staged, the failure kept", rolledBack, []op{{Action: "retry", Version: "1.1.0"}}, healthFailed,
			"1.1.0: health check failed: app.service is not active", "stage 1.1.0"},
		{"retried and abandoned: the failure kept", rolledBack, []op{{Action: "retry", Version: "1.1.0"}, {Action: "abandon", Version: "1.1.0"}}, healthFailed,
			"1.1.0: health check failed: app.service is not active", "abandon 1.1.0"},
		{"another release failed too: both kept", rolledBack, []op{{Action: "import", Version: "1.2.0"}, {Action: "stage", Version: "1.2.0"},
			{Action: "begin", Boot: "b2"}, {Action: "rollback", Version: "1.2.0"}}, healthFailed,
			"1.1.0: health check failed: app.service is not active, 1.2.0: health check failed: app.service is not active", "rollback 1.2.0"},
		{"another release confirmed: forgotten", rolledBack, []op{{Action: "import", Version: "1.2.0"}, {Action: "stage", Version: "1.2.0"},
			{Action: "begin", Boot: "b2"}, {Action: "confirm", Version: "1.2.0"}}, healthFailed, "", "confirm 1.2.0"},
		{"retried and confirmed: forgotten", rolledBack, []op{{Action: "retry", Version: "1.1.0"}, {Action: "begin", Boot: "b2"},
			{Action: "confirm", Version: "1.1.0"}}, healthFailed, "", "confirm 1.1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.mustRun(t, tc.setup...)
			before := n.snapshot(t)
			called := false
			_, err := n.machine("b9", at(1800000000)).Import(context.Background(), testReleases["1.1.0"].record(),
				func(context.Context, string) error { called = true; return nil })
			if !errors.Is(err, ErrFailedBefore) || called || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("stage of 1.1.0 again: %v (fill called: %v), want %v saying %q", err, called, ErrFailedBefore, tc.refused)
			}
			if d := diffSnapshots(before, n.snapshot(t)); d != "" {
				t.Errorf("the refusal changed the node:\n%s", d)
			}
			for _, o := range tc.then {
				if o.Action == "retry" || o.Action == "stage" {
					testReleases[o.Version].importBlobs(t, n.root)
				}
				if _, err := n.run(t, n.machine(o.Boot, at(1800000000)), o); err != nil {
					t.Fatalf("%s: %v", o, err)
				}
			}
			s := n.checkConverged(t)
			var failed []string
			for _, f := range s.Failed {
				failed = append(failed, f.Version+": "+f.Message)
			}
			if got := strings.Join(failed, ", "); got != tc.failed {
				t.Errorf("failed in the state: %q, want %q", got, tc.failed)
			}
			if got := s.Last.Action + " " + s.Last.Version; got != tc.last {
				t.Errorf("last %q, want %q", got, tc.last)
			}
			st, err := n.machine("b9").Status()
			if err != nil || !reflect.DeepEqual(st.Failed, s.Failures()) {
				t.Errorf("status: failed %+v (%v), want %+v", st.Failed, err, s.Failures())
			}
		})
	}
}

// The failure an agent that predates Failed recorded (only in last, the
// field dropped when it wrote) refuses the release too, and is kept in
// Failed by the next transition, which moves last on.
func TestFailedBeforeOlderAgent(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.mustRun(t, op{Action: "init"}, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"},
		op{Action: "begin", Boot: "b1"}, op{Action: "rollback", Version: "1.1.0"})
	p := filepath.Join(n.root, contract.StateFile)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(mustRead(t, p), &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["failed"]; !ok {
		t.Fatalf("the rollback recorded no failed: %s", mustRead(t, p))
	}
	delete(raw, "failed") // as the older agent writes it back
	if err := os.WriteFile(p, mustJSON(t, raw), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := n.machine("b2").Stage(context.Background(), testReleases["1.1.0"].record()); !errors.Is(err, ErrFailedBefore) {
		t.Errorf("stage of 1.1.0 after an older agent wrote the state: %v", err)
	}
	n.mustRun(t, op{Action: "import", Version: "1.2.0"}, op{Action: "stage", Version: "1.2.0"})
	s, err := n.machine("b2").Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Failed) != 1 || s.Failed[0].Version != "1.1.0" || s.Last.Action != "stage" {
		t.Errorf("after staging 1.2: failed %+v, last %+v; want 1.1's failure kept", s.Failed, s.Last)
	}
}

func mustRead(t testing.TB, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// A rolled-back release's files are replaced by the current release's, and
// a file only it owned is removed.
func TestRollbackRestoresFiles(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.mustRun(t, op{Action: "init"}, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"},
		op{Action: "begin", Boot: "b1"})
	if got := string(mustRead(t, filepath.Join(n.root, quadlet))); !strings.Contains(got, "app:1.1") {
		t.Fatalf("trying 1.1: %s holds %q", quadlet, got)
	}
	if _, err := os.Stat(filepath.Join(n.root, only10)); !os.IsNotExist(err) {
		t.Errorf("trying 1.1: 1.0's own file is still there (%v)", err)
	}
	n.mustRun(t, op{Action: "rollback", Version: "1.1.0"})
	if got := string(mustRead(t, filepath.Join(n.root, quadlet))); !strings.Contains(got, "app:1.0") {
		t.Errorf("after rollback: %s holds %q", quadlet, got)
	}
	for _, p := range []string{only10} {
		if _, err := os.Stat(filepath.Join(n.root, p)); err != nil {
			t.Errorf("after rollback: %s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(n.root, env)); !os.IsNotExist(err) {
		t.Errorf("after rollback: 1.1's own file is still there (%v)", err)
	}
	s := n.checkConverged(t)
	if s.Last.Action != "rollback" || s.Last.OK || !strings.Contains(s.Last.Message, "app.service") {
		t.Errorf("last result %+v, want a failed rollback saying why", s.Last)
	}
}

// A trying release gets maxAttempts boots; beginning twice in one boot
// counts once; the boot after the last attempt rolls it back.
func TestBeginCountsBoots(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.mustRun(t, op{Action: "init"}, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"})
	for _, tc := range []struct {
		boot     string
		attempts int
		versions string
	}{
		{"b1", 1, "1.0.0/-/-/1.1.0"},
		{"b1", 1, "1.0.0/-/-/1.1.0"},
		{"b2", 2, "1.0.0/-/-/1.1.0"},
		{"b3", 3, "1.0.0/-/-/1.1.0"},
		{"b4", 0, "1.0.0/-/-/-"},
		{"b5", 0, "1.0.0/-/-/-"},
	} {
		s, err := n.machine(tc.boot).Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s.Attempts != tc.attempts || versions(s) != tc.versions {
			t.Errorf("boot %s: attempts %d, %s; want %d, %s", tc.boot, s.Attempts, versions(s), tc.attempts, tc.versions)
		}
	}
	s := n.checkConverged(t)
	if s.Last.Action != "rollback" || !strings.Contains(s.Last.Message, "3 boots") {
		t.Errorf("last result %+v", s.Last)
	}
}

// Refused transitions say what to do and change nothing on the node.
func TestRefused(t *testing.T) {
	t.Parallel()
	bad := testReleases["1.2.0"].record()
	bad.Files = append(bad.Files, contract.ReleaseFile{Path: "/var/lib/kiln/state.json", Mode: 0o644, Digest: sha("x")})
	missingBlob := testReleases["1.3.0"].record() // blobs never imported
	tests := []struct {
		name  string
		setup []op
		try   func(m *Machine) error
		is    error
		want  string
	}{
		{"stage same version", nil, func(m *Machine) error {
			_, err := m.Stage(context.Background(), testReleases["1.0.0"].record())
			return err
		}, ErrNotNewer, "not newer"},
		{"stage older", []op{{Action: "import", Version: "1.2.0"}, {Action: "stage", Version: "1.2.0"}, {Action: "begin", Boot: "b"}, {Action: "confirm", Version: "1.2.0"}, {Action: "import", Version: "1.1.0"}}, func(m *Machine) error {
			_, err := m.Stage(context.Background(), testReleases["1.1.0"].record())
			return err
		}, ErrNotNewer, "never an older one"},
		{"stage while staged", []op{{Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"}, {Action: "import", Version: "1.2.0"}}, func(m *Machine) error {
			_, err := m.Stage(context.Background(), testReleases["1.2.0"].record())
			return err
		}, ErrBusy, "abandon"},
		{"stage while trying", []op{{Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"}, {Action: "begin", Boot: "b"}, {Action: "import", Version: "1.2.0"}}, func(m *Machine) error {
			_, err := m.Stage(context.Background(), testReleases["1.2.0"].record())
			return err
		}, ErrBusy, "being tried"},
		{"stage without its blobs", nil, func(m *Machine) error {
			_, err := m.Stage(context.Background(), missingBlob)
			return err
		}, nil, "import the release's blobs first"},
		{"stage a file in kiln's state", []op{{Action: "import", Version: "1.2.0"}}, func(m *Machine) error {
			_, err := m.Stage(context.Background(), bad)
			return err
		}, nil, "outside the directories a release may own"},
		{"stage a non-semver version", nil, func(m *Machine) error {
			r := testReleases["1.2.0"].record()
			r.Version = "two"
			_, err := m.Stage(context.Background(), r)
			return err
		}, nil, "not semver"},
		{"confirm nothing", nil, func(m *Machine) error {
			_, err := m.Confirm(context.Background(), "1.1.0")
			return err
		}, ErrNoSuch, "current 1.0.0"},
		{"confirm the staged, not tried", []op{{Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"}}, func(m *Machine) error {
			_, err := m.Confirm(context.Background(), "1.1.0")
			return err
		}, ErrNoSuch, "staged 1.1.0"},
		{"roll back nothing", nil, func(m *Machine) error {
			_, err := m.Rollback(context.Background(), "1.1.0", "x")
			return err
		}, ErrNoSuch, ""},
		{"abandon another", []op{{Action: "import", Version: "1.1.0"}, {Action: "stage", Version: "1.1.0"}}, func(m *Machine) error {
			_, err := m.Abandon(context.Background(), "1.2.0")
			return err
		}, ErrNoSuch, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			n.mustRun(t, append([]op{{Action: "init"}}, tt.setup...)...)
			before := n.snapshot(t)
			err := tt.try(n.machine("b"))
			if err == nil || (tt.is != nil && !errors.Is(err, tt.is)) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %v containing %q", err, tt.is, tt.want)
			}
			if d := diffSnapshots(before, n.snapshot(t)); d != "" {
				t.Errorf("a refused transition changed the node:\n%s", d)
			}
		})
	}
}

// Before Init there is no state; transitions say so. Init records the
// factory release; a second Init never replaces a recorded state.
func TestInit(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	if _, err := n.machine("b").Begin(context.Background()); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "no release state") {
		t.Errorf("begin before init: %v", err)
	}
	n.mustRun(t, op{Action: "init"}, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"})
	s, err := n.machine("b").Init(context.Background(), testReleases["1.0.0"].record())
	if err != nil || versions(s) != "1.0.0/-/1.1.0/-" {
		t.Errorf("init over a recorded state: %v %v", versions(s), err)
	}
}

// A store blob damaged after staging is caught when its file is installed:
// the node's file stays as it was and the error names the blob.
func TestDamagedBlobInstallsNothing(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.mustRun(t, op{Action: "init"}, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"})
	f := testReleases["1.1.0"].record().Files[0]
	blob := filepath.Join(n.root, contract.ReleaseStore, "blobs", "sha256", strings.TrimPrefix(f.Digest, "sha256:"))
	if err := os.WriteFile(blob, []byte(strings.Repeat("!", int(f.Size))), 0o644); err != nil {
		t.Fatal(err)
	}
	before := mustRead(t, filepath.Join(n.root, f.Path))
	_, err := n.machine("b").Begin(context.Background())
	if err == nil || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), blob) {
		t.Fatalf("begin with a damaged blob: %v", err)
	}
	if after := mustRead(t, filepath.Join(n.root, f.Path)); string(after) != string(before) {
		t.Errorf("%s changed to %q", f.Path, after)
	}
}

var errPulled = errors.New("read /media/stick/oci/blobs/sha256/…: input/output error")

// Import runs its fill only once the node agrees to take the release, and
// records nothing when the fill fails (the stick was pulled out); what the
// failed fill left is collected by the next converge.
func TestImport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := newNode(t)
	n.mustRun(t, op{Action: "init"}, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"})
	called := false
	_, err := n.machine("b").Import(ctx, testReleases["1.2.0"].record(), func(context.Context, string) error { called = true; return nil })
	if !errors.Is(err, ErrBusy) || called {
		t.Errorf("import while staged: %v, fill called: %v", err, called)
	}
	n.mustRun(t, op{Action: "abandon", Version: "1.1.0"})

	storeDir := filepath.Join(n.root, contract.ReleaseStore, "blobs", "sha256")
	blobsBefore, _ := os.ReadDir(storeDir)
	stateBefore := mustRead(t, filepath.Join(n.root, contract.StateFile))
	pinsBefore := mustRead(t, filepath.Join(n.root, contract.PinsDropIn))
	tr := testReleases["1.2.0"]
	_, err = n.machine("b").Import(ctx, tr.record(), func(_ context.Context, dir string) error {
		copied := 0
		return tr.fill(dir, func(string) error {
			if copied++; copied == 3 {
				return errPulled
			}
			return nil
		})
	})
	if !errors.Is(err, errPulled) || !strings.Contains(err.Error(), "import 1.2.0") {
		t.Fatalf("import with a failing fill: %v", err)
	}
	if got := mustRead(t, filepath.Join(n.root, contract.StateFile)); string(got) != string(stateBefore) {
		t.Errorf("a failed import changed the state:\n%s", got)
	}
	if got := mustRead(t, filepath.Join(n.root, contract.PinsDropIn)); string(got) != string(pinsBefore) {
		t.Errorf("a failed import changed the pins:\n%s", got)
	}
	if entries, _ := os.ReadDir(storeDir); len(entries) != len(blobsBefore)+2 {
		t.Errorf("the store holds %d blobs after the failed fill, want the %d kept and the 2 it copied", len(entries), len(blobsBefore))
	}
	n.mustRun(t, op{Action: "converge"})
	n.checkConverged(t)

	// Plugged in again: the import goes through.
	n.mustRun(t, op{Action: "import+stage", Version: "1.2.0"})
	if s := n.checkConverged(t); versions(s) != "1.0.0/-/1.2.0/-" {
		t.Errorf("after the import: %s", versions(s))
	}
}

// The first Init records the files Ignition wrote under the release
// directories as the factory release's, contents kept in the store (hidden
// files and files elsewhere are not a release's); a factory release that
// lists its files (contents on the image partition) is taken as it is.
// Either way a rollback to the factory release puts its files back.
func TestInitRecordsFactoryFiles(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	for _, p := range []string{"/etc/containers/systemd/.app.container.swp", "/etc/containers/registries.conf.d/admin.conf"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(n.root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.root, p), []byte("not a release file"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n.mustRun(t, op{Action: "init"})
	s := n.checkConverged(t)
	want := testReleases["1.0.0"].record()
	if got, _ := json.Marshal(s.Current.Files); string(got) != string(mustJSON(t, want.Files)) {
		t.Errorf("factory files recorded:\n%s\nwant\n%s", got, mustJSON(t, want.Files))
	}
	if len(s.Current.Blobs) != len(want.Files) {
		t.Errorf("factory blobs in the store: %v", s.Current.Blobs)
	}

	listed := newNode(t)
	testReleases["1.0.0"].importBlobs(t, listed.root) // file contents on the image partition
	if _, err := listed.machine("b").Init(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	if s := listed.checkConverged(t); len(s.Current.Blobs) != 0 {
		t.Errorf("a factory release that lists its files got store blobs: %v", s.Current.Blobs)
	}

	for _, n := range []*node{n, listed} {
		n.mustRun(t, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"},
			op{Action: "begin", Boot: "b1"}, op{Action: "rollback", Version: "1.1.0"})
		for p, content := range testReleases["1.0.0"].files {
			if got, err := os.ReadFile(filepath.Join(n.root, p)); err != nil || string(got) != content {
				t.Errorf("after rollback to the factory release: %s = %q, %v", p, got, err)
			}
		}
		n.checkConverged(t)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Two agents never change the state at once: the second waits for the
// first (here, an import still copying) and says so.
func TestLockSerialises(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.mustRun(t, op{Action: "init"})
	copying, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		tr := testReleases["1.1.0"]
		_, err := n.machine("b").Import(context.Background(), tr.record(), func(_ context.Context, dir string) error {
			close(copying)
			<-release
			return tr.fill(dir, func(string) error { return nil })
		})
		done <- err
	}()
	<-copying
	var log lockedBuffer
	converged := make(chan error, 1)
	go func() {
		_, err := n.machine("b", WithLog(&log)).Converge(context.Background())
		converged <- err
	}()
	for !strings.Contains(log.String(), "waiting for another kiln agent") {
		select {
		case err := <-converged:
			t.Fatalf("converge ran while an import held the state: %v", err)
		default:
			time.Sleep(time.Millisecond)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-converged; err != nil {
		t.Fatal(err)
	}
	if s := n.checkConverged(t); versions(s) != "1.0.0/-/1.1.0/-" {
		t.Errorf("after import and converge: %s", versions(s))
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestKeyRotation: the node trusts a release's keys once that release is
// confirmed, not while it is staged or tried; a release rolled back never
// changed them; the factory's are what Ignition wrote.
func TestKeyRotation(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	names := func(keys ...string) []string {
		var out []string
		for _, k := range keys {
			out = append(out, testKey(t, k).FileName())
		}
		slices.Sort(out)
		return out
	}
	expect := func(when string, keys ...string) {
		t.Helper()
		if got, want := n.trusted(t), names(keys...); !slices.Equal(got, want) {
			t.Errorf("%s: the node trusts %v, want %v (keys %v)", when, got, want, keys)
		}
	}
	n.mustRun(t, op{Action: "init"})
	if s := n.checkConverged(t); len(s.Current.Trust) != 1 || s.Current.Trust[0].KeyID != testKey(t, "A").KeyID {
		t.Errorf("the factory release records trust %+v, want key A from %s", s.Current.Trust, contract.TrustDir)
	}
	expect("factory", "A")
	n.mustRun(t, op{Action: "import", Version: "1.1.0"}, op{Action: "stage", Version: "1.1.0"})
	expect("1.1 staged", "A")
	n.mustRun(t, op{Action: "begin", Boot: "b1"})
	expect("1.1 tried", "A")
	n.mustRun(t, op{Action: "rollback", Version: "1.1.0"})
	expect("1.1 rolled back", "A")
	n.mustRun(t, op{Action: "import", Version: "1.1.0"}, op{Action: "retry", Version: "1.1.0"}, op{Action: "begin", Boot: "b2"}, op{Action: "confirm", Version: "1.1.0"})
	expect("1.1 confirmed", "A", "B")
	n.mustRun(t, op{Action: "import", Version: "1.2.0"}, op{Action: "stage", Version: "1.2.0"}, op{Action: "begin", Boot: "b3"}, op{Action: "confirm", Version: "1.2.0"})
	expect("1.2 confirmed", "B")
	n.checkConverged(t)
}
