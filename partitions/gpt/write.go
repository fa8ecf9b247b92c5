package gpt

import (
	"fmt"
	"os"
	"strings"

	diskgpt "github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/uuid"
)

// Write writes l as f's partition table, for a disk of size bytes:
// protective MBR, primary and backup GPT, l.GUID the disk GUID, each of
// l.Partitions as it is (number, LBAs, type, name, GUID, attributes).
func Write(f *os.File, l *Layout, size int64) error {
	t := &diskgpt.Table{
		LogicalSectorSize:  l.SectorSize,
		PhysicalSectorSize: l.SectorSize,
		ProtectiveMBR:      true,
		GUID:               l.GUID,
	}
	for _, p := range l.Partitions {
		t.Partitions = append(t.Partitions, &diskgpt.Partition{
			Index: p.Number, Start: p.FirstLBA, End: p.LastLBA,
			Type: diskgpt.Type(p.Type), Name: p.Name, GUID: p.GUID, Attributes: p.Attributes,
		})
	}
	if err := t.Write(f, size); err != nil {
		return fmt.Errorf("write partition table: %w", err)
	}
	return nil
}

// kilnNamespace is the name-based UUID namespace of GUIDs kiln derives.
var kilnNamespace = uuid.MustParse("6f0e5a0c-3b7e-4d49-9a8e-1c2b7d4e9f30")

// DeriveGUID returns the GUID for purpose ("disk", a partition name) from
// seed: a name-based (SHA-1, version 5) UUID, in lower case as
// /dev/disk/by-partuuid names it (Layout shows GUIDs in upper case).
func DeriveGUID(seed []byte, purpose string) string {
	data := append([]byte(purpose+"\x00"), seed...)
	return uuid.NewSHA1(kilnNamespace, data).String()
}

// GUIDOf is the GUID whose bytes are the first 16 of b (a digest), upper
// case as Layout shows GUIDs.
func GUIDOf(b []byte) string {
	var u uuid.UUID
	copy(u[:], b)
	return strings.ToUpper(u.String())
}
