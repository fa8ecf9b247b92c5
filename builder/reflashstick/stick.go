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
	"strings"

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
	Agent string
	// SecureBootKey is the db private key (kiln key secureboot's db.key)
	// for a recipe with secureBoot: it signs the stick's own boot files, so
	// the stick boots where the disk does, and the disk when Write builds it.
	SecureBootKey   string
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
// complete (builder/output): on any error nothing is left and an existing
// output is untouched.
func Write(ctx context.Context, recipePath string, o Options) (*Result, error) {
	s, err := newStick(ctx, recipePath, o)
	if err != nil {
		return nil, err
	}
	defer s.cleanup()
	for _, step := range []func(context.Context) error{
		s.prepareSecureBoot, // first: a missing or wrong key fails before any long work
		s.makeWorkDir,
		s.buildDisk,
		s.verifyDisk,
		s.stagePayload,
		s.assemble,
		s.commit,
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return &Result{Output: o.Output, Built: s.built, Size: s.layout.Size, Record: s.rec, About: s.about, AgentSize: s.Agent.Size, Layout: s.layout}, nil
}

// stick is one run of Write. Each step is a method that reads what the
// steps before it left on the struct and adds its own result, in the order
// Write calls them (as builder's build).
type stick struct {
	*builder.Run // the recipe, the timestamp, the agent the stick runs
	o            Options
	recipePath   string
	log          io.Writer

	work   string // beside the output: the payload tree, the disk when built
	tree   string // the payload partition's tree, under work
	built  bool   // the disk was built from the recipe, not given
	disk   *builder.Report
	rec    *recovery.Record
	about  *recovery.About
	out    *output.File
	layout *gpt.Layout

	secureBoot *builder.SecureBootESP // the stick's signed boot files, nil without secureBoot
}

// newStick reads and checks everything that needs no long work: the
// recipe and the files it names, the agent, and the output against them.
func newStick(ctx context.Context, recipePath string, o Options) (*stick, error) {
	if o.Progress == nil {
		o.Progress = progress.Discard()
	}
	run, err := builder.StartRun(ctx, recipePath, builder.RunOptions{Agent: o.Agent, SourceDateEpoch: o.SourceDateEpoch})
	if err != nil {
		return nil, err
	}
	if err := builder.CheckNoSecureBootKey(run.Recipe, o.SecureBootKey); err != nil {
		return nil, err
	}
	s := &stick{Run: run, o: o, recipePath: recipePath, log: o.Build.Log}
	if s.log == nil {
		s.log = io.Discard
	}
	var disk []output.Input
	if o.Disk != "" {
		disk = append(disk, output.Input{What: "the appliance disk (--disk)", Path: o.Disk})
	}
	if err := output.Check(o.Output, "reflash.img", s.Inputs("the agent binary the stick carries", disk...)); err != nil {
		return nil, err
	}
	return s, nil
}

// workDirPrefix names the work directory beside the output (the payload
// tree, and the disk when the stick builds it).
const workDirPrefix = ".kiln-reflash-"

// makeWorkDir removes what killed runs left and makes this run's work
// directory beside the output.
func (s *stick) makeWorkDir(context.Context) error {
	workDir := output.Work{Dir: filepath.Dir(s.o.Output), Prefix: workDirPrefix}
	output.Sweep(s.o.Output, "reflash-stick run", s.log, workDir)
	work, err := output.MkdirWork(workDir)
	if err != nil {
		return fmt.Errorf("work directory beside %s: %w", s.o.Output, err)
	}
	s.work, s.tree = work, filepath.Join(work, "payload")
	return nil
}

// prepareSecureBoot, for a recipe with secureBoot, checks the key and the
// base and signs systemd-boot (builder.PrepareSecureBootESP): the stick's
// ESP gets what the disk's gets, so it boots on a machine with Secure
// Boot on, or in setup mode (a new one) enrols the keys as the disk would.
func (s *stick) prepareSecureBoot(ctx context.Context) error {
	if s.Recipe.SecureBoot == nil {
		return nil
	}
	var err error
	s.secureBoot, err = builder.PrepareSecureBootESP(ctx, s.Recipe, builder.SecureBootESPOptions{
		Key: s.o.SecureBootKey, What: "reflash stick", Epoch: s.Epoch,
		NoImageVerity: true, // the stick's image partition: the record's digests check every byte
	})
	return err
}

// cleanup removes the work directory and, unless commit ran, the
// temporary output.
func (s *stick) cleanup() {
	s.secureBoot.Remove()
	if s.work != "" {
		os.RemoveAll(s.work)
	}
	s.out.Discard()
}

// buildDisk, when no disk is given, builds the recipe's appliance disk with
// kiln build's pipeline and the stick's agent, timestamp and progress (the
// same bytes kiln build writes), in the work directory: so it goes with
// it, and on the same filesystem as the payload tree, which hard-links it.
func (s *stick) buildDisk(ctx context.Context) error {
	if s.o.Disk != "" {
		return nil
	}
	s.built = true
	bo := s.o.Build
	bo.Output, bo.Agent, bo.SourceDateEpoch, bo.Progress = filepath.Join(s.work, recovery.DiskFile), s.o.Agent, s.Epoch, s.o.Progress
	bo.SecureBootKey = s.o.SecureBootKey
	res, err := builder.Build(ctx, s.recipePath, bo)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.log, "built the appliance disk (%s, %d images, disk GUID %s)\n", human.Bytes(res.Layout.Size), len(res.Contents.Images), res.Layout.GUID)
	s.o.Disk = bo.Output
	// The next steps name the disk as that line does, not by its path in
	// the work directory.
	s.o.Progress = progress.Rename(s.o.Progress, func(name string) string {
		return strings.ReplaceAll(name, bo.Output, "the appliance disk")
	})
	return nil
}

// verifyDisk checks the disk end to end, as kiln verify does, and that it
// is this recipe's appliance.
func (s *stick) verifyDisk(ctx context.Context) error {
	rep, err := builder.Verify(ctx, s.o.Disk, builder.VerifyOptions{}, s.o.Progress)
	if err != nil {
		return fmt.Errorf("not putting %s on a reflash stick: %w", s.o.Disk, err)
	}
	r := s.Recipe
	if c := rep.Contents; c.Recipe != r.Name || c.Version != r.Version {
		return fmt.Errorf("%s is appliance %s %s, the recipe %s is %s %s: give the disk built from this recipe",
			s.o.Disk, c.Recipe, c.Version, r.Path, r.Name, r.Version)
	}
	if r.SecureBoot != nil && rep.Contents.SecureBoot == nil {
		return fmt.Errorf("%s was built without Secure Boot, the recipe %s has secureBoot: build the disk with kiln build --secure-boot-key, or let reflash-stick build it", s.o.Disk, r.Path)
	}
	s.disk = rep
	return nil
}

// stagePayload lays out the payload tree: the agent, the disk, its record,
// about.json.
func (s *stick) stagePayload(ctx context.Context) error {
	r := s.Recipe
	s.rec = &recovery.Record{DiskGUID: s.disk.Layout.GUID, Unattended: r.Reflash.Unattended || s.o.Unattended, Target: target(r.Reflash.Target)}
	if err := s.stageAgent(); err != nil {
		return err
	}
	if err := s.stageDisk(ctx); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(s.tree, recovery.RecordFile), s.rec); err != nil {
		return err
	}
	s.about = &recovery.About{Disk: *s.disk.Contents, Agent: s.Agent.Version, Kiln: version.Current()}
	if s.secureBoot != nil {
		s.about.SecureBoot = s.secureBoot.Record()
	}
	return writeJSON(filepath.Join(s.tree, recovery.AboutFile), s.about)
}

// assemble writes the stick image: the recipe's base OS, booting into
// kiln agent reflash, with the payload partition after it.
func (s *stick) assemble(ctx context.Context) error {
	var err error
	if s.out, err = output.Create(s.o.Output); err != nil {
		return err
	}
	var opts []partitions.Option
	if s.secureBoot != nil {
		opts = append(opts, partitions.WithESP(s.secureBoot.Write))
	}
	r := s.Recipe
	seed := sha256.Sum256([]byte("kiln reflash stick\x00" + s.rec.SHA256))
	s.layout, err = partitions.Assemble(ctx, s.out.File, partitions.Disk{
		Base:     partitions.Base{Path: r.Resolve(r.Base.Path), Digest: r.Base.Digest},
		Geometry: partitions.Geometry{Placement: partitions.PlaceEnd},
		Image: partitions.Image{
			Tree: s.tree,
			// The disk inside is mostly the image partition, already
			// compressed; uncompressed, the stick reads at the medium's speed.
			Compression: "none",
			NoVerity:    true, // the record's digests check every byte the agent writes
		},
		SourceDateEpoch: s.Epoch,
		GUIDSeed:        seed[:],
	}, append(opts,
		partitions.WithPartition(recovery.PartitionName, recovery.PartitionType),
		partitions.WithIgnition(s.ignition),
		partitions.WithTempDir(s.work), // swept with it if this run is killed
		// The disk's build showed the same steps: these are the stick's.
		partitions.WithProgress(progress.Rename(s.o.Progress, func(name string) string { return name + " (stick)" })))...)
	return err
}

// ignition is the stick's config: the units that run kiln agent reflash
// from the payload partition, and the recipe's user and SSH keys.
func (s *stick) ignition(id partitions.ImageIdentity) ([]byte, error) {
	r := s.Recipe
	us, err := units.RenderReflash(units.ReflashParams{PartitionGUID: id.PartitionGUID, Unattended: s.rec.Unattended})
	if err != nil {
		return nil, err
	}
	return ignition.Render(ignition.Config{Version: r.Ignition.Version, User: r.Ignition.User, SSHKeys: r.Ignition.SSHKeys, Units: us})
}

// commit makes the finished stick image the output (output.File.Commit).
func (s *stick) commit(ctx context.Context) error { return s.out.Commit(ctx) }

func target(t recipes.ReflashTarget) recovery.Target {
	return recovery.Target{Path: t.Path, Model: t.Model, MinSize: t.MinSize.Bytes, MaxSize: t.MaxSize.Bytes}
}

// stageAgent puts the agent the stick runs in the payload.
func (s *stick) stageAgent() error {
	if err := os.MkdirAll(filepath.Join(s.tree, filepath.Dir(recovery.AgentBinary)), 0o755); err != nil {
		return err
	}
	if err := linkOrCopy(s.Agent.Path, filepath.Join(s.tree, recovery.AgentBinary)); err != nil {
		return fmt.Errorf("agent %s: %w", s.Agent.Path, err)
	}
	return nil
}

// stageDisk puts the disk in the payload (hard-linked when it can be, else
// copied sparse) and fills the record's digests from the bytes read.
func (s *stick) stageDisk(ctx context.Context) error {
	disk := s.o.Disk
	dst := filepath.Join(s.tree, recovery.DiskFile)
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
	t := s.o.Progress.Task("record "+disk, fi.Size())
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
	c.Fill(s.rec)
	return nil
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
