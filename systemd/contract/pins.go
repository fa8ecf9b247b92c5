package contract

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/BurntSushi/toml"
	"github.com/opencontainers/go-digest"
)

// The pins (PinsDropIn): a CRI-O crio.conf.d drop-in whose [crio.image]
// pinned_images lists every image the appliance runs, by digest and by
// name, so kubelet's image garbage collection never removes one (the
// Toolforge failure). The factory renders it into the Ignition config; the
// node's release state machine rewrites it when an upgrade moves the pins
// (systemd/agent/pins writes it).

// PinRefs returns the references that pin im: repo@digest, and the name as
// written (tagged, :latest when it has neither tag nor digest, or its own
// digest when it differs from Digest, as with a multi-arch index). CRI-O
// matches pins against full names, so they are fully qualified the way the
// runtime normalises them (docker.io/library/… for Docker Hub short names).
func PinRefs(im Image) ([]string, error) {
	ref, err := ParseReference(im.Name)
	if err != nil {
		return nil, fmt.Errorf("pin image %q: not a valid image reference: %v", im.Name, err)
	}
	if _, err := digest.Parse(im.Digest); err != nil {
		return nil, fmt.Errorf("pin image %q: digest %q: %v (want sha256:<64 hex>)", im.Name, im.Digest, err)
	}
	refs := []string{ref.Repository() + "@" + im.Digest}
	switch {
	case ref.Digest != "":
		// A tag next to a digest ("repo:tag@sha256:…") is not how CRI-O names
		// images; pin the digest form only.
		if n := ref.Repository() + "@" + ref.Digest; n != refs[0] {
			refs = append(refs, n)
		}
	case ref.Tag != "":
		refs = append(refs, ref.Repository()+":"+ref.Tag)
	default:
		refs = append(refs, ref.Repository()+":latest")
	}
	return refs, nil
}

// RenderPins returns the drop-in for images: sorted, without duplicates, so
// the same images always give the same bytes.
func RenderPins(images []Image) ([]byte, error) {
	seen := map[string]bool{}
	var all []string
	for _, im := range images {
		refs, err := PinRefs(im)
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			if !seen[r] {
				seen[r] = true
				all = append(all, r)
			}
		}
	}
	sort.Strings(all)
	return renderPins(all)
}

// renderPins writes the drop-in for refs. The table header is fixed text; the
// list goes through the TOML encoder, so each reference is quoted as TOML
// quotes (Go's %q does not: it writes \x01 where TOML wants \u0001).
func renderPins(refs []string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# Rendered by kiln: every image this appliance needs, by digest and by name,\n")
	b.WriteString("# so that kubelet's image garbage collection never removes one.\n")
	b.WriteString("[crio.image]\n")
	err := toml.NewEncoder(&b).Encode(struct {
		PinnedImages lines `toml:"pinned_images"`
	}{refs})
	if err != nil {
		return nil, fmt.Errorf("render pins: %w", err)
	}
	return b.Bytes(), nil
}

// lines is a TOML array of strings written one element a line, as people
// write long lists (the encoder writes arrays on one line).
type lines []string

func (l lines) MarshalTOML() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("[\n")
	for _, s := range l {
		q, err := toml.Marshal(struct {
			V string `toml:"v"`
		}{s})
		if err != nil {
			return nil, err
		}
		// q is `v = "…"` and a newline: keep the quoted value.
		b.WriteString("  ")
		b.Write(bytes.TrimSuffix(bytes.TrimPrefix(q, []byte("v = ")), []byte("\n")))
		b.WriteString(",\n")
	}
	b.WriteString("]")
	return b.Bytes(), nil
}

// ReadPins returns the references a pins drop-in lists, parsed as TOML as
// CRI-O does; a key CRI-O would not know is an error (the file is not
// kiln's).
func ReadPins(path string) ([]string, error) {
	var conf struct {
		Crio struct {
			Image struct {
				PinnedImages []string `toml:"pinned_images"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	md, err := toml.DecodeFile(path, &conf)
	if err != nil {
		return nil, fmt.Errorf("read pins: %w", err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		return nil, fmt.Errorf("read pins %s: keys CRI-O would not know: %v", path, u)
	}
	return conf.Crio.Image.PinnedImages, nil
}
