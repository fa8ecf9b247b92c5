// Package firstboot decides when the node no longer needs its temporary
// registry: when every image of the partition's kiln.json is in the node's
// containers/storage, the main store or an additional (preloaded) one. It
// asks containers/storage itself, by manifest digest (or image ID), the same
// store CRI-O and podman use, so "present" means what the runtime will find:
// no podman or crictl binary is needed on the node, and a name that merely
// points at other content does not count.
package firstboot

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"go.podman.io/storage"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/internal/localimage"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Missing returns the images the store (with its additional image stores)
// does not hold, in input order. An image is present when an image in the
// store lists its manifest digest, or has its ID.
func Missing(store storage.Store, images []contract.Image) ([]contract.Image, error) {
	var missing []contract.Image
	for _, im := range images {
		ids, err := localimage.Find(store, im)
		if err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			missing = append(missing, im)
		}
	}
	return missing, nil
}

// Wait polls the store until every image is present or ctx ends (bound it
// with a timeout). Each change in what is missing is logged once.
func Wait(ctx context.Context, store storage.Store, images []contract.Image, interval time.Duration, log io.Writer) error {
	if log == nil {
		log = io.Discard
	}
	if interval <= 0 {
		interval = 5 * time.Second
	}
	start := time.Now()
	last := -1
	for {
		missing, err := Missing(store, images)
		if err != nil {
			return err
		}
		if len(missing) == 0 {
			fmt.Fprintf(log, "all %d image(s) are in local storage (after %s)\n", len(images), time.Since(start).Round(time.Second))
			return nil
		}
		if len(missing) != last {
			last = len(missing)
			fmt.Fprintf(log, "%d of %d image(s) in local storage; waiting for: %s\n",
				len(images)-len(missing), len(images), names(missing))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s, %d of %d image(s) are still not in local storage: %s. "+
				"The local registry and its mirror stay up until the next reboot (the first boot's check then runs again); "+
				"to finish now, start the workloads that use them or pull them (crictl pull NAME)",
				time.Since(start).Round(time.Second), len(missing), len(images), names(missing))
		case <-time.After(interval):
		}
	}
}

// MarkDone atomically writes the marker that keeps first boot from running again.
func MarkDone(marker string, images []contract.Image) error {
	text := fmt.Sprintf("kiln first boot complete: all %d image(s) in local storage\n", len(images))
	return atomicfile.WriteFile(marker, []byte(text), 0o644)
}

func names(images []contract.Image) string {
	var s []string
	for _, im := range images {
		s = append(s, im.Name+"@"+im.Digest)
	}
	return strings.Join(s, ", ")
}
