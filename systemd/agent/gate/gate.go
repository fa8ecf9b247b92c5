// Package gate is the mirror gate: it points the container runtime at the
// node's local registry (a registries.conf drop-in) only once that registry
// answers a real GET /v2/ with 200 AND serves this partition's manifests by
// digest, and takes the pointer away again before the registry stops.
//
// Why both checks: Gardener's nodes were pointed at a cache before it
// answered, so every pull waited for a timeout; Zarf's "wait for the
// registry" was satisfied by a different registry on the same name that did
// not have the images. An answer on the port proves neither.
package gate

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/kiln-appliance/kiln/systemd/agent/internal/atomicfile"
	"github.com/kiln-appliance/kiln/systemd/agent/state"
	"github.com/kiln-appliance/kiln/systemd/contract"
)

// Gate holds what to wait for and what to write.
type Gate struct {
	Listen     string           // registry address, e.g. 127.0.0.1:5050
	Upstreams  []string         // registry hosts to mirror, e.g. quay.io, docker.io
	MirrorTags bool             // mirror tag pulls too, not only digest pulls
	Images     []contract.Image // every manifest that must be served
	DropIn     string           // contract.MirrorDropIn when empty

	Interval time.Duration // between attempts; 500ms when zero
	Client   *http.Client  // a short-timeout client when nil
	Log      io.Writer     // progress for the journal; discarded when nil
}

// New builds a gate for a partition's kiln.json: every served image is
// checked, and every host they come from (plus the recipe's upstreams) is
// mirrored.
func New(c *contract.Contents) (*Gate, error) {
	// The same rule the factory applied: the address also goes into the
	// drop-in's comment and mirror locations.
	listen, err := contract.ListenAddress(c.Registry.Listen)
	if err != nil {
		return nil, fmt.Errorf("kiln.json: registry listen address %v", err)
	}
	g := &Gate{Listen: listen, MirrorTags: c.Registry.MirrorTags}
	hosts := map[string]bool{}
	for _, h := range c.Registry.Upstreams {
		hosts[h] = true
	}
	for _, im := range c.Images {
		if !im.Served {
			continue
		}
		ref, err := contract.ParseReference(im.Name)
		if err != nil {
			return nil, fmt.Errorf("kiln.json: %v", err)
		}
		hosts[ref.Host] = true
		g.Images = append(g.Images, im)
	}
	for h := range hosts {
		g.Upstreams = append(g.Upstreams, h)
	}
	sort.Strings(g.Upstreams)
	return g, nil
}

// AddState adds what the node's release state asks of the mirror: the
// active release's served images (the one being tried at an upgrade boot)
// must answer too before the mirror opens, and the hosts of every release
// the registry serves (state.State.Served) are mirrored.
func (g *Gate) AddState(s *state.State) error {
	waiting := map[contract.Image]bool{}
	for _, im := range g.Images {
		waiting[contract.Image{Name: im.Name, Digest: im.Digest}] = true
	}
	hosts := map[string]bool{}
	for _, h := range g.Upstreams {
		hosts[h] = true
	}
	for i, r := range s.Served() { // the first is the active one
		for _, im := range r.Images {
			if !im.Served {
				continue
			}
			ref, err := contract.ParseReference(im.Name)
			if err != nil {
				return fmt.Errorf("release state, release %s: %v", r.Version, err)
			}
			if !hosts[ref.Host] {
				hosts[ref.Host] = true
				g.Upstreams = append(g.Upstreams, ref.Host)
			}
			key := contract.Image{Name: im.Name, Digest: im.Digest}
			if i == 0 && !waiting[key] {
				waiting[key] = true
				g.Images = append(g.Images, im)
			}
		}
	}
	sort.Strings(g.Upstreams)
	return nil
}

// DropInContents is the registries.conf (v2) drop-in: for each upstream
// host, the local registry as its only mirror, namespaced by host (the
// registry serves /v2/<host>/<repo>/…). The upstream stays the fallback, so
// a miss still pulls from upstream when the node is online.
func (g *Gate) DropInContents() []byte {
	mode := "digest-only"
	if g.MirrorTags {
		mode = "all"
	}
	type mirror struct {
		Location       string `toml:"location"`
		Insecure       bool   `toml:"insecure"`
		PullFromMirror string `toml:"pull-from-mirror"`
	}
	type registry struct {
		Prefix   string   `toml:"prefix"`
		Location string   `toml:"location"`
		Mirror   []mirror `toml:"mirror"`
	}
	var conf struct {
		Registry []registry `toml:"registry"`
	}
	for _, h := range g.Upstreams {
		conf.Registry = append(conf.Registry, registry{Prefix: h, Location: h,
			Mirror: []mirror{{Location: g.Listen + "/" + h, Insecure: true, PullFromMirror: mode}}})
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Written by kiln-mirror.service (kiln agent mirror-gate) once the local registry\n")
	fmt.Fprintf(&b, "# at %s served this appliance's images; removed before it stops.\n\n", g.Listen)
	enc := toml.NewEncoder(&b)
	enc.Indent = ""
	if err := enc.Encode(conf); err != nil {
		panic(fmt.Sprintf("encode registries.conf drop-in: %v", err)) // only strings and bools: cannot fail
	}
	return b.Bytes()
}

// Check makes one attempt: GET /v2/ must answer 200, and every image's
// manifest must be served by digest with that digest in Docker-Content-Digest.
func (g *Gate) Check(ctx context.Context) error {
	base := "http://" + g.Listen + "/v2/"
	resp, err := g.do(ctx, http.MethodGet, base, "")
	if err != nil {
		return fmt.Errorf("no registry answers at %s: %v", g.Listen, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s answered %s, want 200 OK", base, resp.Status)
	}
	for _, im := range g.Images {
		ref, err := contract.ParseReference(im.Name)
		if err != nil {
			return err
		}
		repo := ref.Repository()
		url := base + repo + "/manifests/" + im.Digest
		resp, err := g.do(ctx, http.MethodHead, url, im.MediaType)
		if err != nil {
			return fmt.Errorf("HEAD %s: %v", url, err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the registry at %s answers but does not serve %s@%s (HEAD manifest: %s): "+
				"it is not (yet) serving this partition, or another program is listening on that address",
				g.Listen, repo, im.Digest, resp.Status)
		}
		if got := resp.Header.Get("Docker-Content-Digest"); got != im.Digest {
			return fmt.Errorf("the registry at %s serves %s@%s with Docker-Content-Digest %q: not this partition's content",
				g.Listen, repo, im.Digest, got)
		}
	}
	return nil
}

// do sends one bodiless request and closes the response body.
func (g *Gate) do(ctx context.Context, method, url, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	client := g.Client
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp, nil
}

// Wait retries Check until it passes or ctx ends (bound it with a timeout);
// each new reason for waiting is logged once.
func (g *Gate) Wait(ctx context.Context) error {
	interval := g.Interval
	if interval <= 0 {
		interval = 500 * time.Millisecond
	}
	start := time.Now()
	g.logf("waiting for the local registry at %s to serve %d image(s)\n", g.Listen, len(g.Images))
	var last string
	for {
		err := g.Check(ctx)
		if err == nil {
			g.logf("local registry at %s serves all %d image(s) (after %s)\n", g.Listen, len(g.Images), time.Since(start).Round(time.Millisecond))
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("mirror gate: the local registry at %s was not serving this appliance's images after %s: %s. "+
				"The container runtime was NOT pointed at it. Check: journalctl -b -u kiln-registry.service",
				g.Listen, time.Since(start).Round(time.Second), reason(err, last))
		}
		if err.Error() != last {
			last = err.Error()
			g.logf("still waiting: %s\n", last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

// reason prefers the last real answer over the attempt the deadline cut short.
func reason(err error, last string) string {
	if last != "" {
		return last
	}
	return err.Error()
}

// Open waits for the registry (Wait) and then atomically writes the drop-in.
// Nothing is written if the wait fails.
func (g *Gate) Open(ctx context.Context) error {
	if len(g.Upstreams) == 0 {
		g.logf("no served images: nothing to mirror, no drop-in written\n")
		return nil
	}
	if err := g.Wait(ctx); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(g.dropIn(), g.DropInContents(), 0o644); err != nil {
		return fmt.Errorf("mirror gate: %w", err)
	}
	g.logf("mirror on: %s sends pulls for %s to %s\n", g.dropIn(), strings.Join(g.Upstreams, ", "), g.Listen)
	return nil
}

// Close removes the drop-in (missing is fine).
func (g *Gate) Close() error {
	if err := atomicfile.Remove(g.dropIn()); err != nil {
		return fmt.Errorf("mirror gate: %w", err)
	}
	g.logf("mirror off: removed %s\n", g.dropIn())
	return nil
}

func (g *Gate) dropIn() string {
	if g.DropIn == "" {
		return contract.MirrorDropIn
	}
	return g.DropIn
}

func (g *Gate) logf(format string, args ...any) {
	if g.Log != nil {
		fmt.Fprintf(g.Log, format, args...)
	}
}
