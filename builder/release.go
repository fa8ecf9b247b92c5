package builder

import (
	"crypto/ed25519"
	"fmt"
	"path"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundle"
)

// releaseFiles are the Ignition files a release puts on the node: the keys
// it accepts upgrade bundles from (contract.TrustDir) and its release files.
// An upgrade bundle carries the same set for the next release.
func releaseFiles(r *recipes.Recipe) ([]ignition.File, error) {
	var files []ignition.File
	keys, err := TrustKeys(r)
	if err != nil {
		return nil, err
	}
	for _, pub := range keys {
		pemBytes, err := bundle.EncodePublicKey(pub) // canonical: the same key, the same file
		if err != nil {
			return nil, err
		}
		files = append(files, ignition.File{Path: path.Join(contract.TrustDir, contract.TrustFileName(pemBytes)), Mode: 0o644, Contents: pemBytes})
	}
	for _, f := range r.Release.Files {
		data, err := inputfile.ReadFile(r.Resolve(f.Source), -1)
		if err != nil {
			return nil, fmt.Errorf("release file %s: %w", f.Path, err)
		}
		files = append(files, ignition.File{Path: f.Path, Mode: int(f.FileMode()), Contents: data})
	}
	return files, nil
}

// TrustKeys reads the recipe's trusted public keys.
func TrustKeys(r *recipes.Recipe) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for _, k := range r.Trust {
		data, err := inputfile.ReadFile(r.Resolve(k), -1)
		if err != nil {
			return nil, fmt.Errorf("trust key: %w", err)
		}
		pub, err := bundle.ParsePublicKey(data)
		if err != nil {
			return nil, fmt.Errorf("trust key %s: %w", r.Resolve(k), err)
		}
		keys = append(keys, pub)
	}
	return keys, nil
}
