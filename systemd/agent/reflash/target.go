package reflash

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-appliance/kiln/internal/blockdev"
	"github.com/kiln-appliance/kiln/internal/human"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

// virtual are kernel disk names that are never a replacement disk.
var virtual = []string{"loop", "ram", "zram", "dm-", "md", "sr", "nbd", "fd", "mtdblock"}

// candidate is one disk considered, and why it was left out ("" if not).
type candidate struct {
	dev *blockdev.Device
	why string
}

// pick chooses the one disk to write, or refuses naming every disk it saw.
func (r *reflasher) pick(rule recovery.Target, size int64) (*blockdev.Device, error) {
	paths, err := r.candidatePaths(rule)
	if err != nil {
		return nil, err
	}
	excluded, err := r.excludedDisks()
	if err != nil {
		return nil, err
	}
	var cands []candidate
	for _, p := range paths {
		d, err := blockdev.Open(p)
		if err != nil {
			if rule.Path != "" {
				return nil, fmt.Errorf("the recipe's target %q matches %s: %w; nothing was written", rule.Path, p, err)
			}
			continue
		}
		why, err := r.exclusion(d, rule, excluded)
		if err != nil {
			return nil, err
		}
		cands = append(cands, candidate{d, why})
	}
	var ok []*blockdev.Device
	for _, c := range cands {
		if c.why == "" {
			ok = append(ok, c.dev)
		}
	}
	switch {
	case len(ok) == 1:
		return ok[0], nil
	case len(ok) == 0:
		return nil, fmt.Errorf("no disk to write the appliance to (%s):%s\n"+
			"attach the replacement disk (at least %s), or fix the recipe's reflash target; nothing was written",
			ruleText(rule), list(cands), human.Bytes(size))
	default:
		var names []string
		for _, d := range ok {
			names = append(names, "\n  "+d.String())
		}
		return nil, fmt.Errorf("%d disks could be the one to overwrite, refusing to guess:%s\n"+
			"detach all but the replacement disk, or set the recipe's reflash target (a /dev/disk/by-path or by-id pattern, model or size); nothing was written",
			len(ok), strings.Join(names, ""))
	}
}

// candidatePaths: the given list (tests), the rule's glob, or every
// non-virtual disk in sysfs.
func (r *reflasher) candidatePaths(rule recovery.Target) ([]string, error) {
	if r.candidates != nil {
		return r.candidates, nil
	}
	if rule.Path != "" {
		matches, err := filepath.Glob(rule.Path)
		if err != nil {
			return nil, fmt.Errorf("the recipe's target %q is not a valid pattern: %w", rule.Path, err)
		}
		var out []string
		for _, m := range matches {
			if p, err := filepath.EvalSymlinks(m); err == nil && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
		return out, nil
	}
	entries, err := os.ReadDir(filepath.Join(sysfs, "block"))
	if err != nil {
		return nil, fmt.Errorf("list disks: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !slices.ContainsFunc(virtual, func(v string) bool { return strings.HasPrefix(e.Name(), v) }) {
			out = append(out, "/dev/"+e.Name())
		}
	}
	return out, nil
}

// excludedDisks names (kernel name → why) the disk the running system
// booted from and the stick the payload is read from: never written, with
// or without a rule.
func (r *reflasher) excludedDisks() (map[string]string, error) {
	mounts, err := blockdev.Mounts()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range mounts {
		if slices.Contains(r.bootMounts, m.Point) {
			for _, d := range blockdev.Disks(sysfs, m.MajMin) {
				out[d] = "the disk this system booted from (" + m.Point + ")"
			}
		}
	}
	if m, ok := mountOf(mounts, r.payload); ok {
		for _, d := range blockdev.Disks(sysfs, m.MajMin) {
			if _, boot := out[d]; !boot {
				out[d] = "the stick this reflash runs from"
			}
		}
	}
	return out, nil
}

// mountOf is the mount that holds path (the longest mount point above it).
func mountOf(mounts []blockdev.Mount, path string) (blockdev.Mount, bool) {
	var best blockdev.Mount
	found := false
	for _, m := range mounts {
		if (path == m.Point || strings.HasPrefix(path, strings.TrimSuffix(m.Point, "/")+"/")) && len(m.Point) >= len(best.Point) {
			best, found = m, true
		}
	}
	return best, found
}

// exclusion says why d may not be the target, "" if it may. A disk the
// rule names explicitly but that is in use is an error, not a skip: the
// recipe meant it, and it must be freed first.
func (r *reflasher) exclusion(d *blockdev.Device, rule recovery.Target, excluded map[string]string) (string, error) {
	if why, ok := excluded[d.Name]; ok {
		if rule.Path != "" {
			return "", fmt.Errorf("the recipe's target %q matches %s, %s: refusing to overwrite it; nothing was written", rule.Path, d, why)
		}
		return why, nil
	}
	uses, err := d.InUse()
	if err != nil {
		return "", err
	}
	if len(uses) > 0 {
		if rule.Path != "" {
			return "", fmt.Errorf("%s is in use (%s): refusing to overwrite a disk in use; unmount it or choose another disk; nothing was written",
				d, strings.Join(uses, "; "))
		}
		return "in use: " + strings.Join(uses, "; "), nil
	}
	switch {
	case d.ReadOnly:
		return "read-only", nil
	case d.Size == 0:
		return "empty (no medium)", nil
	case d.Removable && rule.Path == "":
		return "removable (a stick or card reader; name it in the recipe's reflash target to use it)", nil
	case rule.Model != "" && !globMatch(rule.Model, d.Model):
		return fmt.Sprintf("model %q does not match %q", d.Model, rule.Model), nil
	case rule.MinSize > 0 && d.Size < rule.MinSize:
		return "smaller than the recipe's minimum " + human.Bytes(rule.MinSize), nil
	case rule.MaxSize > 0 && d.Size > rule.MaxSize:
		return "larger than the recipe's maximum " + human.Bytes(rule.MaxSize), nil
	}
	return "", nil
}

func globMatch(pattern, s string) bool {
	ok, err := filepath.Match(pattern, s)
	return err == nil && ok
}

func ruleText(t recovery.Target) string {
	if t.IsZero() {
		return "default rule: " + t.String()
	}
	return "recipe's rule: " + t.String()
}

func list(cs []candidate) string {
	if len(cs) == 0 {
		return "\n  (no disk found)"
	}
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "\n  %s: %s", c.dev, c.why)
	}
	return b.String()
}
