package reflashstick

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/kiln-appliance/kiln/internal/filedigest"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/partitions/squashfs"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

// Report is what `kiln inspect` shows of a reflash stick: what it carries
// and how it picks the disk it writes. It is read, not verified (kiln
// verify checks every byte against the stick's seal).
type Report struct {
	Path   string      `json:"path"`
	Layout *gpt.Layout `json:"layout"`
	// Disk is the appliance disk on the stick: its record (size, sha256,
	// disk GUID) and, when the stick says, its kiln.json.
	Disk Disk `json:"disk"`
	// Target and Unattended: how the stick picks the disk and whether it
	// asks first.
	Target     recovery.Target `json:"target,omitzero"`
	Unattended bool            `json:"unattended"`
	Agent      Agent           `json:"agent"`
	// Kiln made the stick; nil on sticks made before it was recorded.
	Kiln *version.Info `json:"kiln,omitempty"`
	// SecureBoot: the stick's own signed boot files, when its recipe has
	// secureBoot (about.json); nil: it boots unsigned entries.
	SecureBoot *contract.SecureBoot `json:"secureBoot,omitempty"`
}

// Disk is the appliance disk a stick carries.
type Disk struct {
	Size     int64              `json:"size"`
	SHA256   string             `json:"sha256"`
	DiskGUID string             `json:"diskGUID"`
	Contents *contract.Contents `json:"contents,omitempty"` // its kiln.json, when recorded
}

// Agent is the kiln binary the stick runs.
type Agent struct {
	Size    int64         `json:"size"`
	Digest  string        `json:"digest"`
	Version *version.Info `json:"version,omitempty"` // when recorded
}

func payload(l *gpt.Layout) (*gpt.Partition, bool) {
	p, ok := l.Find(recovery.PartitionName)
	return p, ok && strings.EqualFold(p.Type, recovery.PartitionType)
}

// Inspect reads a stick's payload: its record, about.json and agent. A
// damaged stick is an error, never a panic (go-diskfs's squashfs reader
// panics on some damage).
func Inspect(p string) (rep *Report, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: the stick's payload is unreadable (%v): it is damaged or not made by kiln; make or write it again", p, r)
		}
	}()
	l, err := gpt.Inspect(p)
	if err != nil {
		return nil, err
	}
	part, ok := payload(l)
	if !ok {
		return nil, fmt.Errorf("%s has no %s partition: not a reflash stick", p, recovery.PartitionName)
	}
	fsys, closer, err := squashfs.Open(p, part.Offset, part.Size)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	rec, err := readFile(fsys, recovery.RecordFile, recovery.Decode)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	rep = &Report{
		Path: p, Layout: l, Target: rec.Target, Unattended: rec.Unattended,
		Disk: Disk{Size: rec.Size, SHA256: rec.SHA256, DiskGUID: rec.DiskGUID},
	}
	about, err := readFile(fsys, recovery.AboutFile, func(r io.Reader) (*recovery.About, error) {
		var a recovery.About
		return &a, json.NewDecoder(r).Decode(&a)
	})
	switch {
	case err == nil:
		rep.Disk.Contents, rep.Agent.Version, rep.Kiln, rep.SecureBoot = &about.Disk, &about.Agent, &about.Kiln, about.SecureBoot
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if rep.Agent.Digest, rep.Agent.Size, err = filedigest.OfFS(fsys, recovery.AgentBinary); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return rep, nil
}

func readFile[T any](fsys fs.FS, name string, decode func(io.Reader) (T, error)) (T, error) {
	var zero T
	f, err := fsys.Open(name)
	if err != nil {
		return zero, err
	}
	defer f.Close()
	v, err := decode(f)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}
