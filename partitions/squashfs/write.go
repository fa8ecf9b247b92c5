// Package squashfs is the image partition's filesystem: written
// uncompressed by kiln's own writer (sqfswrite: every file type, owners,
// xattrs, hard links) or compressed by mksquashfs, and read back two ways —
// raw (Raw: an uncompressed filesystem's files as the byte ranges they are,
// read at the speed of sha256) and through go-diskfs's reader, guarded
// against its panics (any filesystem, for inspect and verify).
package squashfs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-appliance/kiln/internal/hosttools"
	"github.com/kiln-appliance/kiln/internal/progress"
	"github.com/kiln-appliance/kiln/partitions/sqfswrite"
)

// Compression values of the image filesystem (recipes.ImagePartition.Compression).
var compressionFlags = map[string][]string{
	"":     nil, // uncompressed: sqfswrite
	"none": nil,
	"gzip": {"-comp", "gzip"},
	"xz":   {"-comp", "xz"},
	"zstd": {"-comp", "zstd"},
	"lz4":  {"-comp", "lz4"},
}

// Options say what to write where.
type Options struct {
	Tree            string // directory to pack
	Disk            string // file to write into
	Offset          int64  // byte offset in Disk
	Compression     string // "" or "none", "zstd", "gzip", "xz", "lz4"
	SourceDateEpoch int64  // every timestamp written
	Attrs           []FileAttrs
	TempDir         string            // for the pseudo file of Attrs ("": $TMPDIR)
	Progress        progress.Reporter // may be nil
	// WritebackEarly starts the disk's writeback behind the writer (see
	// writeback), for a build with nothing to hash after the write.
	WritebackEarly bool
}

// FileAttrs sets the mode and owner a file of the tree gets in the
// filesystem, whatever the staged file has: a file hard-linked from
// elsewhere (a local image layout's blob) is packed as kiln's own copy
// would be, without changing the original.
type FileAttrs struct {
	Path     string // relative to the tree, slash-separated
	Mode     fs.FileMode
	UID, GID uint32
}

// Write packs the tree into the disk file at offset and returns the
// filesystem size in bytes (a multiple of 4 KiB): uncompressed with kiln's
// own writer (sqfswrite: the kernel copies the files' bytes, nothing passes
// through user space), compressed with mksquashfs (docs/FILESYSTEM.md).
// Beware: with -noappend, mksquashfs 4.5.1 truncates a regular destination
// file to zero first, and sqfswrite writes only past the file's end, so
// callers write anything that goes before Offset only after this returns.
func Write(ctx context.Context, o Options) (int64, error) {
	flags, ok := compressionFlags[o.Compression]
	if !ok {
		return 0, fmt.Errorf("image partition compression %q is not supported; use none, zstd, gzip, xz or lz4", o.Compression)
	}
	st, err := os.Stat(o.Tree)
	if err != nil {
		return 0, fmt.Errorf("image partition tree: %w", err)
	}
	if !st.IsDir() {
		return 0, fmt.Errorf("image partition tree %s is not a directory", o.Tree)
	}
	if o.Compression == "" || o.Compression == "none" {
		return writeOwnSquashfs(ctx, o)
	}
	total, err := treeSize(o.Tree)
	if err != nil {
		return 0, err
	}
	args := []string{o.Tree, o.Disk, "-offset", strconv.FormatInt(o.Offset, 10),
		"-noappend", "-no-duplicates", "-b", "1M", "-no-progress", "-quiet",
		// mksquashfs sizes its caches to a quarter of RAM by default (seen:
		// 360 MB RSS); 64M keeps it small and measured no slower.
		"-mem", "64M"}
	args = append(args, flags...)
	if len(o.Attrs) > 0 {
		pf, err := writeAttrs(o.TempDir, o.Attrs)
		if err != nil {
			return 0, err
		}
		defer os.Remove(pf)
		args = append(args, "-pf", pf)
	}
	cmd := exec.CommandContext(ctx, "mksquashfs", args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(o.SourceDateEpoch, 10)) // the last one wins
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out

	task := progressOf(o.Progress).Task("write image filesystem", total)
	stop := watchSize(o.Disk, o.Offset, task)
	err = cmd.Run()
	reported := stop()
	if ctx.Err() != nil {
		task.Done(ctx.Err())
		return 0, ctx.Err()
	}
	if err != nil {
		err = hosttools.RunError("mksquashfs "+strings.Join(args, " "), err, out.Bytes())
		task.Done(err)
		return 0, err
	}
	size, err := Size(o.Disk, o.Offset)
	if err == nil && total > reported {
		progress.Count(task, total-reported) // the task ends at 100 %
	}
	task.Done(err)
	return size, err
}

// writeOwnSquashfs writes the uncompressed filesystem with sqfswrite: the
// tree as it is (owners, xattrs, hard links, devices), o.Attrs applied.
func writeOwnSquashfs(ctx context.Context, o Options) (int64, error) {
	attrs := make(map[string]sqfswrite.Attrs, len(o.Attrs))
	for _, a := range o.Attrs {
		attrs[a.Path] = sqfswrite.Attrs{Mode: a.Mode, UID: a.UID, GID: a.GID}
	}
	plan, err := sqfswrite.Scan(o.Tree, sqfswrite.AsIs(), sqfswrite.WithModTime(o.SourceDateEpoch), sqfswrite.WithAttrs(attrs))
	if err != nil {
		return 0, fmt.Errorf("image partition: %w", err)
	}
	out, err := os.OpenFile(o.Disk, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return 0, fmt.Errorf("image partition: %w", err)
	}
	defer out.Close()
	task := progressOf(o.Progress).Task("write image filesystem", plan.DataBytes())
	var progress io.Writer = task
	if o.WritebackEarly {
		wb := writebackBehind(out, o.Offset)
		defer wb.Close()
		progress = io.MultiWriter(task, wb)
	}
	err = plan.Write(ctx, out, o.Offset, progress)
	task.Done(err)
	if err != nil {
		return 0, fmt.Errorf("image partition: %w", err)
	}
	return plan.Size(), nil
}

// writeAttrs writes attrs as mksquashfs "modify" pseudo definitions
// ("PATH m MODE UID GID") into a temp file in dir and returns its name.
func writeAttrs(dir string, attrs []FileAttrs) (string, error) {
	f, err := os.CreateTemp(dir, "kiln-attrs-")
	if err != nil {
		return "", fmt.Errorf("mksquashfs pseudo file: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, a := range attrs {
		if strings.ContainsAny(a.Path, " \t\n\"\\") || a.Path == "" || strings.HasPrefix(a.Path, "/") {
			f.Close()
			os.Remove(f.Name())
			return "", fmt.Errorf("mksquashfs pseudo file: cannot name %q", a.Path)
		}
		fmt.Fprintf(w, "%s m %o %d %d\n", a.Path, a.Mode.Perm(), a.UID, a.GID)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("mksquashfs pseudo file: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("mksquashfs pseudo file: %w", err)
	}
	return f.Name(), nil
}

// Size reads the size of the filesystem at offset of disk: bytes_used
// from its superblock, rounded up to the 4 KiB padding mksquashfs writes.
func Size(disk string, offset int64) (int64, error) {
	f, err := os.Open(disk)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, 96)
	if _, err := f.ReadAt(sb, offset); err != nil {
		return 0, fmt.Errorf("read squashfs superblock: %w", err)
	}
	if string(sb[:4]) != "hsqs" {
		return 0, fmt.Errorf("no squashfs superblock at offset %d of %s", offset, disk)
	}
	used := int64(binary.LittleEndian.Uint64(sb[40:48]))
	return (used + 4095) &^ 4095, nil
}

func treeSize(root string) (int64, error) {
	var total int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("image partition tree: %w", err)
	}
	return total, nil
}

// watchSize reports the growth of the file past offset until stopped
// (mksquashfs has no machine-readable progress); stop returns the bytes
// reported.
func watchSize(path string, offset int64, task progress.Task) (stop func() int64) {
	done := make(chan struct{})
	finished := make(chan struct{})
	var last int64
	go func() {
		defer close(finished)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				// Uncompressed, the filesystem is about the size of the
				// tree; compressed, progress ends early and jumps to 100 %.
				if st, err := os.Stat(path); err == nil && st.Size()-offset > last {
					n := st.Size() - offset - last
					last += n
					progress.Count(task, n)
				}
			}
		}
	}()
	return func() int64 { close(done); <-finished; return last }
}

func progressOf(r progress.Reporter) progress.Reporter {
	if r == nil {
		return progress.Discard()
	}
	return r
}

// writebackStep is how far the writer gets ahead before the disk is asked
// to write what it has written.
const writebackStep = 32 << 20

// writeback trails a writer that fills a file front to back from base,
// starting the disk's writeback of each writebackStep it has passed
// (sync_file_range, SYNC_FILE_RANGE_WRITE: started, not waited for), so the
// disk writes while the writer copies instead of after it. Its Write
// counts bytes written (the writer's progress).
type writeback struct {
	written, kicked int64
	kick            chan int64
	done            chan struct{}
}

func writebackBehind(f *os.File, base int64) *writeback {
	w := &writeback{kick: make(chan int64, 1), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var from int64
		for to := range w.kick {
			unix.SyncFileRange(int(f.Fd()), base+from, to-from, unix.SYNC_FILE_RANGE_WRITE)
			from = to
		}
	}()
	return w
}

func (w *writeback) Write(p []byte) (int, error) {
	w.written += int64(len(p))
	if w.written-w.kicked >= writebackStep {
		select {
		case w.kick <- w.written:
			w.kicked = w.written
		default: // still writing back the last step: the next kick covers this one
		}
	}
	return len(p), nil
}

// Close waits for the last writeback started.
func (w *writeback) Close() {
	close(w.kick)
	<-w.done
}
