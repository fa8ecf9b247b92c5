package bundlefmt

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

func testKey(t *testing.T) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	privPEM, pubPEM, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ParsePrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParsePublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

func testManifest(t testing.TB, pub ed25519.PublicKey) *Manifest {
	t.Helper()
	k, err := TrustedKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	return &Manifest{
		SchemaVersion: SchemaVersion, Recipe: "acme", Version: "1.1.0", Arch: "amd64", LockDigest: d("9"),
		Kind: KindDelta, AppliesTo: []contract.ReleaseID{{Version: "1.0.0", LockDigest: d("8")}},
		Images: []Image{{Image: contract.Image{Name: "quay.io/acme/app:1.1", Digest: d("a")}, Blobs: []string{d("b"), d("c")}}},
		Blobs: []Blob{
			{Digest: d("a"), Size: 500, OnStick: true},
			{Digest: d("b"), Size: 100, OnStick: true},
			{Digest: d("c"), Size: 1000, OnStick: false},
		},
		Space:        Space{CopyBytes: 600},
		ReleaseFiles: []contract.ReleaseFile{{Path: "/etc/containers/systemd/app.container", Mode: 0o644}},
		Agent:        File{Path: AgentBinary, Size: 1, Digest: d("7")},
		Filesystem:   Filesystem{Size: 4096, Metadata: d("6")},
		Trust:        []contract.TrustKey{k},
		Kiln:         version.Info{Version: "v1.4.0", Go: "go1.26.8", Edition: version.Factory},
		AgentVersion: version.Info{Version: "v1.4.0", Go: "go1.26.8", Edition: version.Node},
	}
}

// schema1 is the manifest as kiln wrote it before schema 2, and as the
// agents of that time decode it (strictly: an unknown field is an error),
// frozen here down to its nested types.
type schema1 struct {
	SchemaVersion int    `json:"schemaVersion"`
	Recipe        string `json:"recipe"`
	Version       string `json:"version"`
	Arch          string `json:"arch"`
	LockDigest    string `json:"lockDigest"`
	Created       int64  `json:"created"`
	Kind          string `json:"kind"`
	AppliesTo     []struct {
		Version    string `json:"version"`
		LockDigest string `json:"lockDigest"`
	} `json:"appliesTo,omitempty"`
	Images []struct {
		Name      string   `json:"name"`
		Digest    string   `json:"digest"`
		MediaType string   `json:"mediaType"`
		Size      int64    `json:"size"`
		Served    bool     `json:"served"`
		Preloaded bool     `json:"preloaded"`
		ImageID   string   `json:"imageID"`
		Blobs     []string `json:"blobs"`
	} `json:"images"`
	Blobs []struct {
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
		MediaType string `json:"mediaType"`
		OnStick   bool   `json:"onStick"`
		Unpacked  int64  `json:"unpacked,omitempty"`
	} `json:"blobs"`
	Space struct {
		CopyBytes     int64 `json:"copyBytes"`
		UnpackedBytes int64 `json:"unpackedBytes"`
	} `json:"space"`
	ReleaseFiles []struct {
		Path   string `json:"path"`
		Mode   uint32 `json:"mode"`
		Size   int64  `json:"size"`
		Digest string `json:"digest"`
	} `json:"releaseFiles"`
	Agent        schema1File `json:"agent"`
	AgentOnStick bool        `json:"agentOnStick"`
	Trust        []struct {
		KeyID     string `json:"keyid"`
		PublicKey string `json:"publicKey"`
	} `json:"trust"`
	Filesystem struct {
		Size     int64  `json:"size"`
		Metadata string `json:"metadata"`
	} `json:"filesystem"`
	Files []schema1File `json:"files"`
}

type schema1File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Digest string `json:"digest"`
	Offset int64  `json:"offset"`
}

// Compatibility both ways: this kiln reads schema 1 and 2; what it writes
// as schema 1 an agent of schema 1 reads; a newer schema is refused as made
// by a newer kiln, naming it, not for a field this kiln does not know.
func TestManifestSchemas(t *testing.T) {
	priv, pub := testKey(t)
	open := func(m *Manifest) (*Manifest, error) {
		env, err := Sign(m, priv)
		if err != nil {
			t.Fatal(err)
		}
		hdr, _ := EncodeHeader(env, HeaderSize(len(env)))
		got, _, _, err := Open(bytes.NewReader(hdr), []ed25519.PublicKey{pub})
		return got, err
	}

	m2 := testManifest(t, pub)
	if got, err := open(m2); err != nil || got.Kiln != m2.Kiln || got.AgentVersion != m2.AgentVersion {
		t.Errorf("schema 2: %+v, %v", got, err)
	}

	m1 := testManifest(t, pub)
	m1.SchemaVersion, m1.Kiln, m1.AgentVersion = 1, version.Info{}, version.Info{}
	if got, err := open(m1); err != nil || got.SchemaVersion != 1 {
		t.Errorf("schema 1: %+v, %v", got, err)
	}
	payload, _ := m1.Encode()
	var old schema1
	if err := decodeStrict(payload, &old); err != nil {
		t.Errorf("a schema 1 agent cannot read the schema 1 manifest this kiln writes: %v\n%s", err, payload)
	}

	m1.Kiln = m2.Kiln // schema 1 with a schema 2 field: a schema 1 agent would refuse it
	if _, err := open(m1); !errors.Is(err, ErrDamaged) {
		t.Errorf("schema 1 with a kiln record: %v, want ErrDamaged", err)
	}
	m2.Kiln = version.Info{}
	if _, err := open(m2); !errors.Is(err, ErrDamaged) {
		t.Errorf("schema 2 without its kiln record: %v, want ErrDamaged", err)
	}

	// A manifest from a later kiln: schema 4, with a field this kiln does
	// not know. Its signature is good; the schema is what is refused.
	raw, _ := testManifest(t, pub).Encode()
	raw = bytes.Replace(raw, []byte(`{"schemaVersion":3,`), []byte(`{"schemaVersion":4,"rollout":{"waves":2},`), 1)
	raw = bytes.Replace(raw, []byte(`"kiln":{"version":"v1.4.0"`), []byte(`"kiln":{"version":"v2.0.0"`), 1)
	for _, tc := range []struct {
		name, payload string
		want          []string
	}{
		{"schema 4", string(raw), []string{"bundle made by a newer kiln (v2.0.0): its manifest is schema 4", "reads schemas 1 to 3", "upgrade the node first"}},
		{"schema 4, kiln not named", `{"schemaVersion":4,"kiln":"v2"}`, []string{"newer kiln (version not given)"}},
	} {
		_, err := Decode([]byte(tc.payload))
		if !errors.Is(err, ErrNewerKiln) {
			t.Errorf("%s: %v, want ErrNewerKiln", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(fmt.Sprint(err), w) {
				t.Errorf("%s: %v, want it to say %q", tc.name, err, w)
			}
		}
	}
	if _, err := Decode([]byte(`{"schemaVersion":0}`)); err == nil || errors.Is(err, ErrNewerKiln) {
		t.Errorf("schema 0: %v", err)
	}
	if _, err := Decode([]byte(`{"schemaVersion":2,"rollout":{}}`)); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("schema 2 with an unknown field: %v", err)
	}
}

func TestSignVerify(t *testing.T) {
	priv, pub := testKey(t)
	_, other := testKey(t)
	m := testManifest(t, pub)
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	env, err := Sign(m, priv)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Sign(m, priv)
	if !bytes.Equal(env, again) {
		t.Error("signing the same manifest twice gave different envelopes")
	}
	hdr, _ := EncodeHeader(env, HeaderSize(len(env)))
	if om, h, _, err := Open(bytes.NewReader(hdr), []ed25519.PublicKey{pub}); err != nil || om.Version != "1.1.0" || h.Size != int64(len(hdr)) {
		t.Errorf("Open: %v", err)
	}
	if _, _, _, err := Open(bytes.NewReader(hdr), []ed25519.PublicKey{other}); !errors.Is(err, ErrUntrusted) {
		t.Errorf("Open with another key: %v, want ErrUntrusted", err)
	}
	bad := testManifest(t, pub)
	bad.Space.CopyBytes++ // signed, but inconsistent
	badEnv, _ := Sign(bad, priv)
	badHdr, _ := EncodeHeader(badEnv, HeaderSize(len(badEnv)))
	if _, _, _, err := Open(bytes.NewReader(badHdr), []ed25519.PublicKey{pub}); !errors.Is(err, ErrDamaged) {
		t.Errorf("Open of an inconsistent manifest: %v, want ErrDamaged", err)
	}
	got, id, err := Verify(env, []ed25519.PublicKey{other, pub})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := KeyID(pub); id != want || got.Version != "1.1.0" {
		t.Errorf("verified by %s (want %s), version %s", id, want, got.Version)
	}
	if _, _, err := Verify(env, []ed25519.PublicKey{other}); !errors.Is(err, ErrUntrusted) {
		t.Errorf("verify with another key: %v, want ErrUntrusted", err)
	}
	if _, _, err := Verify(env, nil); !errors.Is(err, ErrUntrusted) {
		t.Errorf("verify with no key: %v, want ErrUntrusted", err)
	}
}

// A signature by a trusted key that does not match the payload means the
// bundle was changed after signing: damaged, not untrusted. A stranger's
// signature stays untrusted.
func TestVerifyDamagedIsNotUntrusted(t *testing.T) {
	priv, pub := testKey(t)
	_, other := testKey(t)
	env, err := Sign(testManifest(t, pub), priv)
	if err != nil {
		t.Fatal(err)
	}
	changed := testManifest(t, pub)
	changed.Version = "9.9.9"
	payload, err := changed.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		PayloadType string `json:"payloadType"`
		Payload     []byte `json:"payload"`
		Signatures  []struct {
			KeyID string `json:"keyid"`
			Sig   string `json:"sig"`
		} `json:"signatures"`
	}
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	e.Payload = payload
	newPayload, _ := json.Marshal(e)
	e.Signatures[0].Sig = strings.Repeat("A", len(e.Signatures[0].Sig)-2) + "=="
	newSig, _ := json.Marshal(e)
	e.Signatures[0].KeyID = "SHA256:someone-else"
	stranger, _ := json.Marshal(e)
	for _, tc := range []struct {
		name    string
		env     []byte
		trusted []ed25519.PublicKey
		want    error
		msg     string
	}{
		{"payload changed", newPayload, []ed25519.PublicKey{other, pub}, ErrDamaged, "does not match the signed manifest"},
		{"signature changed", newSig, []ed25519.PublicKey{pub}, ErrDamaged, "changed after signing"},
		{"signed by a key the node does not trust", env, []ed25519.PublicKey{other}, ErrUntrusted, "not signed by a trusted key (signed by [SHA256:"},
		{"names a key the node does not trust", stranger, []ed25519.PublicKey{pub}, ErrUntrusted, "signed by [SHA256:someone-else]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Verify(tc.env, tc.trusted)
			if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.msg) {
				t.Errorf("got %v, want %v saying %q", err, tc.want, tc.msg)
			}
			if tc.want == ErrDamaged && errors.Is(err, ErrUntrusted) {
				t.Errorf("%v: damaged, and untrusted too", err)
			}
		})
	}
}

// Every single flipped bit of the header (envelope included) is refused.
func TestHeaderEveryBitFlipIsRefused(t *testing.T) {
	priv, pub := testKey(t)
	env, err := Sign(testManifest(t, pub), priv)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := EncodeHeader(env, HeaderSize(len(env))+4096)
	if err != nil || len(hdr)%4096 != 0 {
		t.Fatalf("header is %d bytes: %v", len(hdr), err)
	}
	if _, err := EncodeHeader(env, HeaderSize(len(env))+MaxSlack+4096); err == nil {
		t.Error("a header with more than MaxSlack padding was accepted")
	}
	h, err := ReadHeader(bytes.NewReader(hdr))
	if err != nil || !bytes.Equal(h.Envelope, env) {
		t.Fatalf("read back: %v", err)
	}
	for i := range hdr {
		for bit := range 8 {
			b := bytes.Clone(hdr)
			b[i] ^= 1 << bit
			h, err := ReadHeader(bytes.NewReader(b))
			if err == nil {
				_, _, err = Verify(h.Envelope, []ed25519.PublicKey{pub})
			}
			if err == nil {
				t.Fatalf("flipping bit %d of byte %d went unnoticed", bit, i)
			}
		}
	}
}

func TestReadHeaderNotBundle(t *testing.T) {
	for _, b := range [][]byte{nil, []byte("hsqs"), bytes.Repeat([]byte{0}, 8192)} {
		if _, err := ReadHeader(bytes.NewReader(b)); !errors.Is(err, ErrNotBundle) {
			t.Errorf("%q: %v, want ErrNotBundle", b[:min(len(b), 8)], err)
		}
	}
}

func TestCheckNode(t *testing.T) {
	_, pub := testKey(t)
	m := testManifest(t, pub)
	base := m.AppliesTo[0]
	full := *m
	full.Kind, full.AppliesTo = KindFull, nil
	for _, tc := range []struct {
		name string
		m    *Manifest
		node Node
		want error
	}{
		{"delta on its base", m, Node{Recipe: "acme", Arch: "amd64", Current: base}, nil},
		{"full on any older", &full, Node{Recipe: "acme", Arch: "amd64", Current: contract.ReleaseID{Version: "0.9.0"}}, nil},
		{"other recipe", m, Node{Recipe: "other", Arch: "amd64", Current: base}, ErrOtherAppliance},
		{"other arch", m, Node{Recipe: "acme", Arch: "arm64", Current: base}, ErrOtherAppliance},
		{"replay", m, Node{Recipe: "acme", Arch: "amd64", Current: contract.ReleaseID{Version: "1.1.0"}}, ErrNotNewer},
		{"downgrade", &full, Node{Recipe: "acme", Arch: "amd64", Current: contract.ReleaseID{Version: "1.10.0"}}, ErrNotNewer},
		{"semver, not text", &full, Node{Recipe: "acme", Arch: "amd64", Current: contract.ReleaseID{Version: "1.1.0-rc.1"}}, nil},
		{"delta, other base", m, Node{Recipe: "acme", Arch: "amd64", Current: contract.ReleaseID{Version: "1.0.0", LockDigest: "sha256:x"}}, ErrWrongBase},
		{"staged", m, Node{Recipe: "acme", Arch: "amd64", Current: base, Staged: &contract.ReleaseID{Version: "1.0.5", LockDigest: "sha256:" + strings.Repeat("5", 64)}}, contract.ErrBusy},
		{"trying", m, Node{Recipe: "acme", Arch: "amd64", Current: base, Trying: &contract.ReleaseID{Version: "1.0.5", LockDigest: "sha256:" + strings.Repeat("5", 64)}}, contract.ErrBusy},
		{"this release staged", m, Node{Recipe: "acme", Arch: "amd64", Current: base, Staged: &contract.ReleaseID{Version: m.Version, LockDigest: m.LockDigest}}, ErrAlreadyStaged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.CheckNode(tc.node)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestCheckSpace(t *testing.T) {
	_, pub := testKey(t)
	m := testManifest(t, pub)
	m.Space.UnpackedBytes = 400
	if err := m.CheckSpace(1000); err != nil {
		t.Fatal(err)
	}
	err := m.CheckSpace(999)
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "free 1 B more") {
		t.Fatalf("got %v", err)
	}
}

func TestValidateRefuses(t *testing.T) {
	_, pub := testKey(t)
	for name, spoil := range map[string]func(*Manifest){
		"bad version":        func(m *Manifest) { m.Version = "1.1" },
		"delta with no base": func(m *Manifest) { m.AppliesTo = nil },
		"space wrong":        func(m *Manifest) { m.Space.CopyBytes++ },
		"missing blob":       func(m *Manifest) { m.Images[0].Blobs = append(m.Images[0].Blobs, "sha256:"+strings.Repeat("f", 64)) },
		"release path":       func(m *Manifest) { m.ReleaseFiles[0].Path = "/etc/passwd" },
		"no trust":           func(m *Manifest) { m.Trust = nil },
		"full missing blob":  func(m *Manifest) { m.Kind, m.AppliesTo = KindFull, nil },
	} {
		m := testManifest(t, pub)
		spoil(m)
		if err := m.Validate(); !errors.Is(err, ErrDamaged) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The key files are the standard encodings: openssl reads them.
func TestKeyFilesAreStandard(t *testing.T) {
	privPEM, pubPEM, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "k.key")
	os.WriteFile(key, privPEM, 0o600)
	out, err := exec.Command("openssl", "pkey", "-in", key, "-pubout").Output()
	if err != nil {
		t.Fatalf("openssl pkey: %v", err)
	}
	if !bytes.Equal(out, pubPEM) {
		t.Errorf("openssl derives\n%s\nkiln wrote\n%s", out, pubPEM)
	}
	if _, err := ParsePublicKey(privPEM); err == nil || !strings.Contains(err.Error(), "private key") {
		t.Errorf("private key as public: %v", err)
	}
	if _, err := ParsePrivateKey(pubPEM); err == nil || !strings.Contains(err.Error(), "public key") {
		t.Errorf("public key as private: %v", err)
	}
	if _, err := ParsePublicKey([]byte("ssh-ed25519 AAAA")); err == nil {
		t.Error("non-PEM accepted")
	}
}

func TestCheckFilesystemNamesTheDamage(t *testing.T) {
	fs := bytes.Repeat([]byte{7}, 3*4096)
	copy(fs[100:], "first")
	copy(fs[5000:], "second")
	sum := func(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }
	m := &Manifest{
		Files: []File{ // listed by path, stored in another order
			{Path: "a", Offset: 5000, Size: 3000, Digest: sum(fs[5000:8000])},
			{Path: "b", Offset: 100, Size: 900, Digest: sum(fs[100:1000])},
			{Path: "empty", Offset: 1000, Size: 0, Digest: sum(nil)},
		},
		Filesystem: Filesystem{Size: int64(len(fs))},
	}
	var meta []byte
	meta = append(meta, fs[:100]...)
	meta = append(meta, fs[1000:5000]...)
	meta = append(meta, fs[8000:]...)
	m.Filesystem.Metadata = sum(meta)
	disk := append(make([]byte, 100), fs...)
	if got, err := m.HashMetadata(bytes.NewReader(disk), 100, nil); err != nil || got != m.Filesystem.Metadata {
		t.Fatalf("HashMetadata = %s, %v; want %s", got, err, m.Filesystem.Metadata)
	}
	if err := m.CheckFilesystem(bytes.NewReader(disk), 100, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		at   int
		want string
	}{
		{100 + 6000, "a (bytes 5000-7999 of the filesystem)"},
		{100 + 100, "b (bytes 100-999 of the filesystem)"},
		{100 + 3000, "the filesystem's metadata"},
		{100 + 12000, "the filesystem's metadata"},
	} {
		bad := slices.Clone(disk)
		bad[c.at] ^= 1
		err := m.CheckFilesystem(bytes.NewReader(bad), 100, nil)
		if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("byte %d flipped: got %v, want %q", c.at, err, c.want)
		}
	}
	if err := m.CheckFilesystem(bytes.NewReader(disk[:len(disk)-1]), 100, nil); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("short: %v", err)
	}
	m.Files[2].Offset, m.Files[2].Size = 4999, 2 // overlaps a
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "file a: its bytes at 5000 overlap") {
		t.Errorf("overlap: %v", err)
	}
}

func TestRelease(t *testing.T) {
	_, pub := testKey(t)
	m := testManifest(t, pub)
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	m.ReleaseFiles[0].Digest = d("5")
	// The partition holds the layer c; a, b (and the file's content) must be stored.
	r := m.Release(func(digest string) bool { return digest == d("c") })
	if r.Version != "1.1.0" || len(r.Images) != 1 || r.Images[0].Digest != d("a") || len(r.Files) != 1 {
		t.Fatalf("release %+v", r)
	}
	if want := []string{d("5"), d("a"), d("b")}; !slices.Equal(r.Blobs, want) {
		t.Errorf("blobs %v, want %v", r.Blobs, want)
	}
}
