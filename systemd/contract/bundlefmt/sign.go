package bundlefmt

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/signerverifier"

	"github.com/kiln-appliance/kiln/internal/version"
)

// ErrUntrusted means no signature on the envelope names a trusted key. (One
// that names a trusted key and does not verify is ErrDamaged.)
var ErrUntrusted = errors.New("not signed by a trusted key")

// Sign encodes m and signs it with priv in a DSSE envelope, returned as
// canonical JSON. ed25519 signatures are deterministic, so the same manifest
// and key give the same bytes.
func Sign(m *Manifest, priv ed25519.PrivateKey) ([]byte, error) {
	payload, err := m.Encode()
	if err != nil {
		return nil, err
	}
	sv, err := signerVerifier(priv.Public().(ed25519.PublicKey), priv)
	if err != nil {
		return nil, err
	}
	s, err := dsse.NewEnvelopeSigner(sv)
	if err != nil {
		return nil, err
	}
	env, err := s.SignPayload(context.Background(), PayloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("sign bundle manifest: %w", err)
	}
	return json.Marshal(env)
}

// Verify checks that envelope is signed by one of trusted and returns its
// manifest and the ID of the key that signed it. Nothing in the manifest is
// looked at before the signature is checked.
func Verify(envelope []byte, trusted []ed25519.PublicKey) (*Manifest, string, error) {
	env, err := parseEnvelope(envelope)
	if err != nil {
		return nil, "", err
	}
	if len(trusted) == 0 {
		return nil, "", fmt.Errorf("%w: no trusted keys given", ErrUntrusted)
	}
	var vs []dsse.Verifier
	for _, pub := range trusted {
		sv, err := signerVerifier(pub, nil)
		if err != nil {
			return nil, "", err
		}
		vs = append(vs, sv)
	}
	v, err := dsse.NewEnvelopeVerifier(vs...)
	if err != nil {
		return nil, "", err
	}
	accepted, payload, err := v.VerifyAndDecode(context.Background(), env)
	if err != nil || len(accepted) == 0 {
		if id := trustedSigner(env, trusted); id != "" {
			return nil, "", fmt.Errorf("%w: the signature of %s, a trusted key, does not match the signed manifest: the manifest or its signature was changed after signing (make or copy the bundle again)", ErrDamaged, id)
		}
		return nil, "", fmt.Errorf("%w (signed by %s)", ErrUntrusted, signers(env))
	}
	m, err := Decode(payload)
	if err != nil {
		return nil, "", err
	}
	return m, accepted[0].KeyID, nil
}

// Unverified decodes the manifest without checking its signature, and the
// IDs of the keys the envelope claims signed it: for `kiln inspect`, which
// shows what a bundle says it is. Never act on it.
func Unverified(envelope []byte) (*Manifest, []string, error) {
	env, err := parseEnvelope(envelope)
	if err != nil {
		return nil, nil, err
	}
	payload, err := env.DecodeB64Payload()
	if err != nil {
		return nil, nil, fmt.Errorf("bundle envelope: payload: %w", err)
	}
	m, err := Decode(payload)
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	for _, s := range env.Signatures {
		ids = append(ids, s.KeyID)
	}
	return m, ids, nil
}

// parseEnvelope reads a DSSE envelope strictly: known fields only, kiln's
// payload type, and in canonical form (re-encoding gives the same bytes), so
// no byte of it can change without verification noticing.
func parseEnvelope(b []byte) (*dsse.Envelope, error) {
	var env dsse.Envelope
	if err := decodeStrict(b, &env); err != nil {
		return nil, fmt.Errorf("bundle envelope: %w", err)
	}
	if env.PayloadType != PayloadType {
		return nil, fmt.Errorf("bundle envelope: payload type %q, want %q", env.PayloadType, PayloadType)
	}
	if again, err := json.Marshal(&env); err != nil || !bytes.Equal(again, b) {
		return nil, fmt.Errorf("bundle envelope: not in canonical form (modified after signing)")
	}
	// base64 decoders ignore the spare bits of the last character: insist
	// on the one standard spelling so those bits cannot change either.
	fields := []string{env.Payload}
	for _, s := range env.Signatures {
		fields = append(fields, s.Sig)
	}
	for _, f := range fields {
		raw, err := base64.StdEncoding.DecodeString(f)
		if err != nil || base64.StdEncoding.EncodeToString(raw) != f {
			return nil, fmt.Errorf("bundle envelope: not in canonical form (modified after signing)")
		}
	}
	return &env, nil
}

// trustedSigner returns the ID of a trusted key that one of the envelope's
// signatures names, or "": a signature that names a trusted key and does not
// verify means the bundle was changed, not that a stranger signed it.
func trustedSigner(env *dsse.Envelope, trusted []ed25519.PublicKey) string {
	for _, pub := range trusted {
		id, err := KeyID(pub)
		if err != nil {
			continue
		}
		for _, sig := range env.Signatures {
			if sig.KeyID == id {
				return id
			}
		}
	}
	return ""
}

func signers(env *dsse.Envelope) string {
	if len(env.Signatures) == 0 {
		return "no key"
	}
	var s []string
	for _, sig := range env.Signatures {
		s = append(s, sig.KeyID)
	}
	return fmt.Sprint(s)
}

func signerVerifier(pub ed25519.PublicKey, priv ed25519.PrivateKey) (*signerverifier.ED25519SignerVerifier, error) {
	id, err := KeyID(pub)
	if err != nil {
		return nil, err
	}
	k := &signerverifier.SSLibKey{
		KeyType: signerverifier.ED25519KeyType,
		Scheme:  signerverifier.ED25519KeyType,
		KeyID:   id,
		KeyVal:  signerverifier.KeyVal{Public: hex.EncodeToString(pub)},
	}
	if priv != nil {
		k.KeyVal.Private = hex.EncodeToString(priv)
	}
	return signerverifier.NewED25519SignerVerifierFromSSLibKey(k)
}

// Encode returns the manifest as canonical JSON (the DSSE payload).
func (m *Manifest) Encode() ([]byte, error) {
	return json.Marshal(m)
}

// ErrNewerKiln means the manifest's schema is newer than this kiln reads.
var ErrNewerKiln = errors.New("bundle made by a newer kiln")

// Decode parses a manifest strictly, of any schema from MinSchemaVersion to
// SchemaVersion. It reads the schema version first, so a newer manifest is
// refused as such (naming the kiln that made it), not for a field this kiln
// does not know.
func Decode(b []byte) (*Manifest, error) {
	var head struct {
		SchemaVersion int             `json:"schemaVersion"`
		Kiln          json.RawMessage `json:"kiln"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("bundle manifest: %w", err)
	}
	if head.SchemaVersion > SchemaVersion {
		var maker struct {
			Version string `json:"version"`
		}
		json.Unmarshal(head.Kiln, &maker) // only to name it
		if maker.Version == "" {
			maker.Version = "version not given"
		}
		me := version.Current()
		return nil, fmt.Errorf("%w (%s): its manifest is schema %d, this %s %s reads schemas %d to %d; upgrade the node first with a bundle made by a kiln it reads (the release it brings carries a newer agent), or make this one with such a kiln",
			ErrNewerKiln, maker.Version, head.SchemaVersion, me.Program(), me.Version, MinSchemaVersion, SchemaVersion)
	}
	if head.SchemaVersion < MinSchemaVersion {
		return nil, fmt.Errorf("bundle manifest: schema version %d, this kiln reads %d to %d", head.SchemaVersion, MinSchemaVersion, SchemaVersion)
	}
	var m Manifest
	if err := decodeStrict(b, &m); err != nil {
		return nil, fmt.Errorf("bundle manifest: %w", err)
	}
	return &m, nil
}

// decodeStrict decodes JSON refusing unknown fields and trailing data.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

// Open is the node's first step with a bundle at the start of r (a stick's
// partition, or a bundle file): it reads only the header, checks the
// signature against trusted, then the manifest's consistency. The
// filesystem starts at the returned header's Size; CheckNode, CheckSpace and
// CheckFilesystem come next.
func Open(r io.ReaderAt, trusted []ed25519.PublicKey) (m *Manifest, h *Header, keyID string, err error) {
	h, err = ReadHeader(r)
	if err != nil {
		return nil, nil, "", err
	}
	m, keyID, err = Verify(h.Envelope, trusted)
	if err != nil {
		return nil, h, "", err
	}
	if err := m.Validate(); err != nil {
		return nil, h, keyID, err
	}
	return m, h, keyID, nil
}
