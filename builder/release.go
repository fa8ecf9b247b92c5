package builder

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	types33 "github.com/coreos/ignition/v2/config/v3_3/types"
	"github.com/opencontainers/go-digest"
	"github.com/vincent-petithory/dataurl"

	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/partitions/bootconfig"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
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
		pemBytes, err := bundlefmt.EncodePublicKey(pub) // canonical: the same key, the same file
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
		pub, err := bundlefmt.ParsePublicKey(data)
		if err != nil {
			return nil, fmt.Errorf("trust key %s: %w", r.Resolve(k), err)
		}
		keys = append(keys, pub)
	}
	return keys, nil
}

// DiskRelease reads what a built disk's Ignition config gives its nodes of
// their first release: the keys they accept upgrade bundles from and the
// release files (those under contract.ReleaseDirs, sorted by path), as an
// upgrade bundle's manifest lists them. A file whose contents Ignition
// fetches (no data URL) is listed without size or digest.
func DiskRelease(disk string) (trust []contract.TrustKey, files []contract.ReleaseFile, err error) {
	raw, err := bootconfig.Read(disk)
	if err != nil {
		return nil, nil, err
	}
	var cfg types33.Config // every later spec's files read the same
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, nil, fmt.Errorf("%s: ignition config: %w", disk, err)
	}
	for _, f := range cfg.Storage.Files {
		isKey := path.Dir(f.Path) == contract.TrustDir
		if !isKey && contract.CheckReleasePath(f.Path) != nil {
			continue
		}
		var data []byte
		if src := f.Contents.Source; src != nil && f.Contents.Compression == nil {
			if u, err := dataurl.DecodeString(*src); err == nil {
				data = u.Data
			}
		}
		if isKey {
			pub, err := bundlefmt.ParsePublicKey(data)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: ignition config: trusted key %s: %w", disk, f.Path, err)
			}
			k, err := bundlefmt.TrustedKey(pub)
			if err != nil {
				return nil, nil, err
			}
			trust = append(trust, k)
			continue
		}
		rf := contract.ReleaseFile{Path: f.Path}
		if f.Mode != nil {
			rf.Mode = uint32(*f.Mode)
		}
		if data != nil {
			rf.Size, rf.Digest = int64(len(data)), digest.FromBytes(data).String()
		}
		files = append(files, rf)
	}
	slices.SortFunc(files, func(a, b contract.ReleaseFile) int { return strings.Compare(a.Path, b.Path) })
	return trust, files, nil
}
