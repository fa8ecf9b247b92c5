// Package pins renders and writes CRI-O's image pins: a crio.conf.d drop-in
// whose [crio.image] pinned_images lists every image the appliance runs, by
// digest and by name, so kubelet's image garbage collection never removes
// one (the Toolforge failure). The builder renders it into the Ignition
// config; the node's agent rewrites it when an upgrade moves the pins.
package pins

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"

	"github.com/opencontainers/go-digest"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Refs returns the references that pin im: repo@digest, and the name as
// written (tagged, :latest when it has neither tag nor digest, or its own
// digest when it differs from Digest, as with a multi-arch index). CRI-O
// matches pins against full names, so they are fully qualified the way the
// runtime normalises them (docker.io/library/… for Docker Hub short names).
func Refs(im contract.Image) ([]string, error) {
	ref, err := contract.ParseReference(im.Name)
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

// Render returns the drop-in for images: sorted, without duplicates, so the
// same images always give the same bytes.
func Render(images []contract.Image) ([]byte, error) {
	seen := map[string]bool{}
	var all []string
	for _, im := range images {
		refs, err := Refs(im)
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
	var b bytes.Buffer
	b.WriteString("# Rendered by kiln: every image this appliance needs, by digest and by name,\n")
	b.WriteString("# so that kubelet's image garbage collection never removes one.\n")
	b.WriteString("[crio.image]\npinned_images = [\n")
	for _, r := range all {
		// References hold only [a-z0-9._:/@-]; quoting is for form's sake.
		fmt.Fprintf(&b, "  %s,\n", strconv.Quote(r))
	}
	b.WriteString("]\n")
	return b.Bytes(), nil
}

// Write renders the pins for images and atomically replaces path with them
// (temp file, fsync, rename, fsync directory): CRI-O never reads half a list.
func Write(path string, images []contract.Image) error {
	data, err := Render(images)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o644)
}
