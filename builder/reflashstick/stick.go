// Package reflashstick writes a recovery reflash stick image (`kiln
// reflash-stick`): the recipe's base OS, booting with an Ignition config
// whose units run `kiln agent reflash` on the console, plus a payload
// partition carrying the appliance disk (one kiln verify accepts), its
// record and the node edition of kiln. The format is
// systemd/contract/reflash, which the agent on the stick reads.
package reflashstick

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-appliance/kiln/builder"
	"github.com/kiln-appliance/kiln/builder/output"
	"github.com/kiln-appliance/kiln/builder/stage"
	"github.com/kiln-appliance/kiln/ignition"
	"github.com/kiln-appliance/kiln/internal/blockdev"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/internal/version"
	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/recipes"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
	"github.com/kiln-appliance/kiln/systemd/units"
)

// Options configure a stick.
type Options struct {
	// Disk is the appliance disk the stick carries: built by kiln from the
	// recipe, and accepted by kiln verify. Empty: Write builds it from the
	// recipe and its lock, as kiln build does (Build configures that build).
	Disk   string
	Output string
	// Build configures the build of the disk when Disk is empty: the cache,
	// the lock, the registries, the log. Its Output, Agent,
	// SourceDateEpoch and Progress are the stick's.
	Build builder.Options
	// Unattended makes the stick write without asking, whatever the
	// recipe's reflash.unattended says.
	Unattended bool
	// Agent is the node edition of kiln the stick runs; empty: kiln-agent
	// beside this executable (refused when there is none).
	Agent           string
	SourceDateEpoch int64 // 0: $SOURCE_DATE_EPOCH, else builder.DefaultSourceDateEpoch
	Progress        progress.Reporter
}

// Result is what Write wrote.
type Result struct {
	Output string
	Built  bool // the disk was built from the recipe, not given
	Size   int64
	Record *recovery.Record
	About  *recovery.About
	// AgentSize is the size of the agent on the stick (About.Agent says
	// which kiln it is).
	AgentSize int64
	Layout    *gpt.Layout
}

// Write makes the stick image for the recipe at recipePath. Like a build,
// it writes a temporary file beside the output and renames it only once
// complete: on any error nothing is left and an existing output is
// untouched.
func Write(ctx context.Context, recipePath string, o Options) (res *Result, err error) {
	if o.Progress == nil {
		o.Progress = progress.Discard()
	}
	epoch, err := builder.SourceDateEpoch(o.SourceDateEpoch)
	if err != nil {
		return nil, err
	}
	r, err := recipes.Load(recipePath)
	if err != nil {
		return nil, err
	}
	if err := r.CheckFiles(); err != nil {
		return nil, err
	}
	agent, err := builder.FindAgent(ctx, o.Agent, r.Arch)
	if err != nil {
		return nil, err
	}
	inputs := append(output.RecipeInputs(r), output.Input{What: "the agent binary the stick carries", Path: agent.Path})
	if o.Disk != "" {
		inputs = append(inputs, output.Input{What: "the appliance disk (--disk)", Path: o.Disk})
	}
	if err := output.Check(o.Output, "reflash.img", inputs); err != nil {
		return nil, err
	}

	log := o.Build.Log
	if log == nil {
		log = io.Discard
	}
	dir := filepath.Dir(o.Output)
	workDir := output.Work{Dir: dir, Prefix: workDirPrefix}
	output.Sweep(o.Output, "reflash-stick run", log, workDir)
	work, err := output.MkdirWork(workDir)
	if err != nil {
		return nil, fmt.Errorf("work directory beside %s: %w", o.Output, err)
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "payload")
	built := o.Disk == ""
	if built {
		// Built in the work directory, so it goes with it, and on the
		// same filesystem as the payload tree, which hard-links it.
		if o.Disk, err = buildDisk(ctx, recipePath, filepath.Join(work, recovery.DiskFile), epoch, o); err != nil {
			return nil, err
		}
	}
	rep, err := builder.Verify(ctx, o.Disk, builder.VerifyOptions{}, o.Progress)
	if err != nil {
		return nil, fmt.Errorf("not putting %s on a reflash stick: %w", o.Disk, err)
	}
	if c := rep.Contents; c.Recipe != r.Name || c.Version != r.Version {
		return nil, fmt.Errorf("%s is appliance %s %s, the recipe %s is %s %s: give the disk built from this recipe",
			o.Disk, c.Recipe, c.Version, r.Path, r.Name, r.Version)
	}

	out, err := output.Create(o.Output)
	if err != nil {
		return nil, err
	}
	defer out.Discard()

	rec := &recovery.Record{DiskGUID: rep.Layout.GUID, Unattended: r.Reflash.Unattended || o.Unattended, Target: target(r.Reflash.Target)}
	if err := stagePayload(ctx, tree, o.Disk, agent.Path, rec, o.Progress); err != nil {
		return nil, err
	}
	about := &recovery.About{Disk: *rep.Contents, Agent: agent.Version, Kiln: version.Current()}
	if err := writeJSON(filepath.Join(tree, recovery.AboutFile), about); err != nil {
		return nil, err
	}
	seed := sha256.Sum256([]byte("kiln reflash stick\x00" + rec.SHA256))
	layout, err := partitions.Assemble(ctx, out.File, partitions.Disk{
		Base:     partitions.Base{Path: r.Resolve(r.Base.Path), Digest: r.Base.Digest},
		Geometry: partitions.Geometry{Placement: partitions.PlaceEnd},
		Image: partitions.Image{
			Tree: tree,
			// The disk inside is mostly the image partition, already
			// compressed; uncompressed, the stick reads at the medium's speed.
			Compression: "none",
			NoVerity:    true, // the record's digests check every byte the agent writes
		},
		SourceDateEpoch: epoch,
		GUIDSeed:        seed[:],
	},
		partitions.WithPartition(recovery.PartitionName, recovery.PartitionType),
		partitions.WithIgnition(func(id partitions.ImageIdentity) ([]byte, error) {
			us, err := units.RenderReflash(units.ReflashParams{PartitionGUID: id.PartitionGUID, Unattended: rec.Unattended})
			if err != nil {
				return nil, err
			}
			return ignition.Render(ignition.Config{Version: r.Ignition.Version, User: r.Ignition.User, SSHKeys: r.Ignition.SSHKeys, Units: us})
		}),
		partitions.WithTempDir(work), // swept with it if this run is killed
		partitions.WithProgress(o.Progress))
	if err != nil {
		return nil, err
	}
	if err := out.Commit(ctx); err != nil {
		return nil, err
	}
	return &Result{Output: o.Output, Built: built, Size: layout.Size, Record: rec, About: about, AgentSize: agent.Size, Layout: layout}, nil
}

// workDirPrefix names the work directory beside the output (the payload
// tree, and the disk when the stick builds it).
const workDirPrefix = ".kiln-reflash-"

// buildDisk builds the recipe's appliance disk to path with kiln build's
// pipeline and the stick's agent, timestamp and progress: the same bytes
// kiln build writes.
func buildDisk(ctx context.Context, recipePath, path string, epoch int64, o Options) (string, error) {
	bo := o.Build
	bo.Output, bo.Agent, bo.SourceDateEpoch, bo.Progress = path, o.Agent, epoch, o.Progress
	res, err := builder.Build(ctx, recipePath, bo)
	if err != nil {
		return "", err
	}
	if bo.Log != nil {
		fmt.Fprintf(bo.Log, "built the appliance disk (%s, %d images, disk GUID %s)\n", human.Bytes(res.Layout.Size), len(res.Contents.Images), res.Layout.GUID)
	}
	return path, nil
}

func target(t recipes.ReflashTarget) recovery.Target {
	return recovery.Target{Path: t.Path, Model: t.Model, MinSize: t.MinSize.Bytes, MaxSize: t.MaxSize.Bytes}
}

// stagePayload lays out the payload tree: the disk (hard-linked when it can be,
// else copied sparse), its record (hashed while read), the agent.
func stagePayload(ctx context.Context, dir, disk, agent string, rec *recovery.Record, p progress.Reporter) error {
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(recovery.AgentBinary)), 0o755); err != nil {
		return err
	}
	if err := linkOrCopy(agent, filepath.Join(dir, recovery.AgentBinary)); err != nil {
		return fmt.Errorf("agent %s: %w", agent, err)
	}
	dst := filepath.Join(dir, recovery.DiskFile)
	linked := os.Link(disk, dst) == nil
	in, err := inputfile.Open(disk)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	c := recovery.NewChunker()
	t := p.Task("record "+disk, fi.Size())
	var w io.Writer = io.MultiWriter(c, t)
	var out *os.File
	if !linked {
		if out, err = os.Create(dst); err != nil {
			return err
		}
		defer out.Close()
		w = io.MultiWriter(c, t, &sparseWriter{f: out})
	}
	_, err = blockdev.Copy(ctx, w, in)
	if err == nil && out != nil {
		err = out.Truncate(fi.Size()) // a trailing hole
	}
	t.Done(err)
	if err != nil {
		return fmt.Errorf("stage %s: %w", disk, err)
	}
	c.Fill(rec)
	return writeJSON(filepath.Join(dir, recovery.RecordFile), rec)
}

func writeJSON(p string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}

// sparseWriter writes sequentially, seeking over all-zero writes so the
// copy keeps the disk's holes (mksquashfs stores zero blocks as sparse
// anyway; this keeps the staging copy small).
type sparseWriter struct {
	f   *os.File
	off int64
}

func (s *sparseWriter) Write(p []byte) (int, error) {
	if !allZero(p) {
		if _, err := s.f.WriteAt(p, s.off); err != nil {
			return 0, err
		}
	}
	s.off += int64(len(p))
	return len(p), nil
}

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// linkOrCopy hard-links the agent, or copies it (another filesystem).
func linkOrCopy(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	return stage.CopyFile(src, dst, 0o755)
}
