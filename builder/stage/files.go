package stage

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/opencontainers/go-digest"
)

// ListFiles walks root in lexical order and returns every regular file with
// its size and sha256, for kiln.json. Blobs of the OCI layout are named by
// their digest and were verified when fetched, so they are not read again.
func ListFiles(root string) ([]contract.File, error) {
	var files []contract.File
	blobPrefix := path.Join(contract.OCIDir, "blobs", "sha256") + "/"
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == contract.ContentsFile {
			return nil
		}
		if hex, ok := strings.CutPrefix(rel, blobPrefix); ok {
			info, err := d.Info()
			if err != nil {
				return err
			}
			files = append(files, contract.File{Path: rel, Size: info.Size(), Digest: digest.NewDigestFromEncoded(digest.SHA256, hex).String()})
			return nil
		}
		sum, size, err := filedigest.Of(p)
		if err != nil {
			return err
		}
		files = append(files, contract.File{Path: rel, Size: size, Digest: sum})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list image partition files: %w", err)
	}
	return files, nil
}

// WriteContents writes kiln.json into root.
func WriteContents(root string, c *contract.Contents) error {
	f, err := os.OpenFile(filepath.Join(root, contract.ContentsFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := c.Encode(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
