//go:build !nodeonly

package main

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strings"

	"github.com/kiln-appliance/kiln/internal/inputfile"
	"github.com/kiln-appliance/kiln/partitions/gpt"
	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
	"github.com/kiln-appliance/kiln/systemd/contract/recovery"
)

// imageKind is what kiln verify, inspect and write were given.
type imageKind int

const (
	kilnDisk     imageKind = iota // a GPT with kiln's image partition (or a damaged GPT: the disk checks say what is wrong)
	bundleImage                   // an upgrade bundle: a file, or a stick image with a bundle partition
	reflashStick                  // a recovery stick image
	otherDisk                     // a GPT disk with none of kiln's partitions (a base image)
	notKiln                       // no GPT disk and no bundle
)

// kilnFiles is what kiln verify, inspect and write take, for messages.
const kilnFiles = "a kiln disk (kiln build), an upgrade bundle or its stick image (kiln bundle) or a recovery stick image (kiln reflash-stick)"

// identity is what a file is; what says it for otherDisk and notKiln.
type identity struct {
	kind imageKind
	what string
}

// notKilnError says what kiln wanted and what it found.
func (id identity) notKilnError(path string) error {
	return fmt.Errorf("%s is not %s: %s", path, kilnFiles, id.what)
}

// identify tells what the file at path is from its first bytes and its
// primary GPT alone, so a file damaged or cut short further on is still
// checked as what it is (and the check says what is wrong). Errors are
// the file's (missing, unreadable, a FIFO).
func identify(path string) (identity, error) {
	f, err := inputfile.Open(path)
	if errors.Is(err, inputfile.ErrNotFile) {
		return identity{}, fmt.Errorf("%w; give a disk image file or a disk device (e.g. /dev/sdX), or an upgrade bundle", err)
	}
	if err != nil {
		return identity{}, err
	}
	head := make([]byte, 4608) // the bundle magic, the MBR and the GPT header of either sector size
	n, err := f.ReadAt(head, 0)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return identity{}, fmt.Errorf("read %s: %w", path, err)
	}
	head = head[:n]
	if strings.HasPrefix(string(head), bundlefmt.Magic) {
		return identity{kind: bundleImage}, nil
	}
	l, err := gpt.ReadTable(path)
	switch {
	case errors.Is(err, gpt.ErrNoPartitionTable):
		return identity{kind: notKiln, what: describeHead(head)}, nil
	case err != nil:
		return identity{kind: kilnDisk}, nil // a GPT header with a damaged table: the disk checks name the damage
	}
	var names []string
	for _, p := range l.Partitions {
		switch {
		case strings.EqualFold(p.Type, bundlefmt.PartitionType):
			return identity{kind: bundleImage}, nil
		case p.Name == recovery.PartitionName:
			return identity{kind: reflashStick}, nil
		case p.Name == contract.PartitionName:
			return identity{kind: kilnDisk}, nil
		}
		names = append(names, fmt.Sprintf("%d %q", p.Number, p.Name))
	}
	if len(names) == 0 {
		names = []string{"none"}
	}
	return identity{kind: otherDisk, what: fmt.Sprintf("it is a GPT disk (partitions: %s) with none of kiln's: a base image?", strings.Join(names, ", "))}, nil
}

// describeHead says what a file that is no GPT disk starts with.
func describeHead(head []byte) string {
	magic := bundlefmt.Magic
	switch {
	case len(head) == 0:
		return "it is empty (0 bytes)"
	case len(head) >= len(magic) && hamming(head[:len(magic)], []byte(magic)) <= 2:
		return fmt.Sprintf("it starts with %q, a few bits off a bundle's %q: a bundle file damaged at its start; copy it again", head[:len(magic)], magic)
	case len(head) < 512+8:
		return fmt.Sprintf("it is %d bytes, too short for a partition table or a bundle header", len(head))
	}
	return fmt.Sprintf("it has neither a bundle header (%q) nor a GPT partition table (\"EFI PART\" at byte 512 or 4096); it starts with \"%s\"", magic, printable(head[:min(len(head), 16)]))
}

// hamming counts the bits that differ between a and b (of one length).
func hamming(a, b []byte) int {
	d := 0
	for i := range a {
		d += bits.OnesCount8(a[i] ^ b[i])
	}
	return d
}

// printable shows bytes as text where they are, as \xNN where not.
func printable(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		if c >= 0x20 && c < 0x7f {
			s.WriteByte(c)
		} else {
			fmt.Fprintf(&s, `\x%02x`, c)
		}
	}
	return s.String()
}
