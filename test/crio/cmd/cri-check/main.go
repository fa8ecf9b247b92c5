// Command cri-check is the e2e appliance's CRI client: it talks to CRI-O
// over its socket with the calls kubelet makes (k8s.io/cri-api), to check
// what CRI-O reports of the appliance's images and of the pods the kubelet
// runs. Check commands print one "KILN-E2E: <name> PASS|FAIL <detail>" line
// per check (the e2e console protocol) and exit 1 if any failed.
//
//	cri-check images NAME=DIGEST...       ListImages: each image present, with that digest, pinned
//	cri-check workload POD IMAGE DIGEST LINE
//	                                      the pod is ready, its container runs IMAGE by DIGEST and logged LINE
//	cri-check ready POD                   exit 0 when the pod is ready and every container of it runs
//	                                      (a release's health check); else one line saying why. With
//	                                      -manifest FILE -unavailable-exit N: exit N when an image the
//	                                      pod manifest FILE names is not in local storage and cannot be
//	                                      pulled (the pod can never start: unhealthy for good)
//	cri-check pull NAME DIGEST            PullImage by name, then ImageStatus: that digest
//	cri-check pinned CHECK NAME DIGEST true|false
//	                                      ImageStatus: the image (by that digest) is pinned, or not
//	cri-check absent CHECK IMAGE...       ImageStatus: none of the images (names or IDs) is in local storage
//
// POD is a pod's name in the namespace kiln-e2e as its manifest names it;
// the kubelet runs a static pod as POD-<node name>, and either is found.
//
// Built CGO_ENABLED=0 by the e2e test and delivered through Ignition.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const podNamespace = "kiln-e2e"

func main() {
	socket := flag.String("socket", "/var/run/crio/crio.sock", "CRI-O's socket")
	timeout := flag.Duration("timeout", 3*time.Minute, "bound for the whole command")
	manifest := flag.String("manifest", "", "ready: the pod's manifest, whose images -unavailable-exit checks")
	unavailable := flag.Int("unavailable-exit", 0, "ready: the exit status when an image of -manifest cannot be had")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: cri-check [-socket PATH] [-timeout D] images|workload|ready|pull|pinned|absent ARGS (see the source's doc comment)")
	}
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fatal(err)
	}
	defer conn.Close()
	c := client{rt: cri.NewRuntimeServiceClient(conn), im: cri.NewImageServiceClient(conn)}
	if _, err := c.rt.Version(ctx, &cri.VersionRequest{}); err != nil {
		fatal(fmt.Errorf("CRI Version on %s: %w", *socket, err))
	}

	ok := true
	switch cmd, rest := args[0], args[1:]; {
	case cmd == "images" && len(rest) > 0:
		ok = c.images(ctx, rest)
	case cmd == "workload" && len(rest) == 4:
		ok = c.workload(ctx, rest[0], rest[1], rest[2], rest[3])
	case cmd == "pull" && len(rest) == 2:
		ok = c.pull(ctx, rest[0], rest[1])
	case cmd == "pinned" && len(rest) == 4 && (rest[3] == "true" || rest[3] == "false"):
		ok = c.pinned(ctx, rest[0], rest[1], rest[2], rest[3] == "true")
	case cmd == "ready" && len(rest) == 1:
		if err := c.ready(ctx, rest[0]); err != nil {
			if *manifest != "" && *unavailable > 0 {
				if missing := c.unavailable(ctx, *manifest); missing != nil {
					fmt.Fprintf(os.Stderr, "cri-check: pod %s can never start: %v\n", rest[0], missing)
					os.Exit(*unavailable)
				}
			}
			fatal(err)
		}
	case cmd == "absent" && len(rest) >= 2:
		ok = c.absent(ctx, rest[0], rest[1:])
	default:
		flag.Usage()
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "cri-check:", err)
	os.Exit(1)
}

type client struct {
	rt cri.RuntimeServiceClient
	im cri.ImageServiceClient
}

func report(name string, pass bool, format string, args ...any) bool {
	word := "FAIL"
	if pass {
		word = "PASS"
	}
	fmt.Printf("KILN-E2E: %s %s %s\n", name, word, fmt.Sprintf(format, args...))
	return pass
}

// short is the check-name form of an image name: quay.io/x/hello:1.0 -> hello.
func short(name string) string {
	n := name[strings.LastIndex(name, "/")+1:]
	n, _, _ = strings.Cut(n, "@")
	n, _, _ = strings.Cut(n, ":")
	return n
}

// repo is name without tag or digest.
func repo(name string) string {
	name, _, _ = strings.Cut(name, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name
}

// images checks ListImages: every NAME=DIGEST present by that digest, pinned.
func (c client) images(ctx context.Context, want []string) bool {
	list, err := c.im.ListImages(ctx, &cri.ListImagesRequest{})
	if err != nil {
		return report("cri-images", false, "ListImages: %v", err)
	}
	ok := true
	for _, w := range want {
		name, digest, found := strings.Cut(w, "=")
		if !found {
			fatal(fmt.Errorf("images: %q is not NAME=DIGEST", w))
		}
		check := "cri-image-" + short(name)
		var img *cri.Image
		for _, i := range list.Images {
			if slices.Contains(i.RepoDigests, repo(name)+"@"+digest) {
				img = i
				break
			}
		}
		switch {
		case img == nil:
			ok = report(check, false, "no image with repo digest %s@%s among %d images: %s", repo(name), digest, len(list.Images), describe(list.Images)) && ok
		case !slices.Contains(img.RepoTags, name):
			ok = report(check, false, "%s@%s has tags %q, not %s", repo(name), digest, img.RepoTags, name) && ok
		case !img.Pinned:
			ok = report(check, false, "%s (%s) is not pinned", name, digest) && ok
		default:
			report(check, true, "%s pinned=true id=%.19s", digest, img.Id)
		}
	}
	return ok
}

func describe(imgs []*cri.Image) string {
	var b []string
	for _, i := range imgs {
		b = append(b, fmt.Sprintf("%v%v pinned=%v", i.RepoTags, i.RepoDigests, i.Pinned))
	}
	s := strings.Join(b, "; ")
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}

// workload checks the kubelet's pod: ready, its container running the
// image by digest, and the line the program printed in its CRI log.
func (c client) workload(ctx context.Context, pod, image, digest, line string) bool {
	sb, err := c.readyPod(ctx, pod)
	if err != nil {
		return report("cri-workload", false, "%v", err)
	}
	ctrs, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: sb.Id}})
	if err != nil || len(ctrs.Containers) != 1 {
		return report("cri-workload", false, "pod %s: containers %v, err %v", pod, ctrs, err)
	}
	st, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ctrs.Containers[0].Id})
	if err != nil {
		return report("cri-workload", false, "ContainerStatus: %v", err)
	}
	s := st.Status
	if s.State != cri.ContainerState_CONTAINER_RUNNING {
		return report("cri-workload", false, "container %s, exit %d, reason %q %q", s.State, s.ExitCode, s.Reason, s.Message)
	}
	if s.ImageRef != repo(image)+"@"+digest && s.ImageRef != digest {
		return report("cri-workload", false, "container runs image %q (%s), want %s@%s", s.ImageRef, s.Image.GetImage(), repo(image), digest)
	}
	// CRI log format: "<time> stdout F <line>" (runc's own warnings go
	// to stderr lines). Bounded wait for the line.
	var got string
	var found bool
	for deadline := time.Now().Add(30 * time.Second); ; {
		got, found = findLogLine(s.LogPath, " stdout F "+line)
		if found || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if !found {
		return report("cri-workload", false, "log %s has no stdout line %q; last: %q", s.LogPath, line, got)
	}
	ip := ""
	if ps, err := c.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: sb.Id}); err == nil && ps.Status.GetNetwork() != nil {
		ip = ps.Status.Network.Ip
	}
	return report("cri-workload", true, "pod %s ready ip=%s; container running %s; log: %s", pod, ip, s.ImageRef, got)
}

// readyPod returns the one ready sandbox of pod (POD or POD-<node name>
// in the kiln-e2e namespace), or says what there is instead.
func (c client) readyPod(ctx context.Context, pod string) (*cri.PodSandbox, error) {
	sbs, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %w", err)
	}
	host, _ := os.Hostname()
	var ready []*cri.PodSandbox
	var other []string
	for _, sb := range sbs.Items {
		m := sb.GetMetadata()
		if m.GetNamespace() != podNamespace || (m.GetName() != pod && m.GetName() != pod+"-"+strings.ToLower(host)) {
			continue
		}
		if sb.State == cri.PodSandboxState_SANDBOX_READY {
			ready = append(ready, sb)
		} else {
			other = append(other, fmt.Sprintf("%.12s %s", sb.Id, sb.State))
		}
	}
	if len(ready) != 1 {
		return nil, fmt.Errorf("pod %s: %d ready sandboxes (others: %v)", pod, len(ready), other)
	}
	return ready[0], nil
}

// ready is a release's health check of pod: its sandbox ready and every
// container of it running (the kubelet restarts a failing one, so a crash
// loop or an image it may not pull shows as not running).
func (c client) ready(ctx context.Context, pod string) error {
	sb, err := c.readyPod(ctx, pod)
	if err != nil {
		return err
	}
	ctrs, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: sb.Id}})
	if err != nil {
		return fmt.Errorf("ListContainers: %w", err)
	}
	running := 0
	for _, ct := range ctrs.Containers {
		if ct.State == cri.ContainerState_CONTAINER_RUNNING {
			running++
		}
	}
	if running == 0 || running != len(ctrs.Containers) {
		return fmt.Errorf("pod %s: %d of %d containers running (the kubelet's journal says why)", pod, running, len(ctrs.Containers))
	}
	fmt.Printf("pod %s ready: %d containers running\n", pod, running)
	return nil
}

// imageLine is an image: line of a pod manifest (YAML).
var imageLine = regexp.MustCompile(`^\s*(?:-\s+)?image:\s*["']?([^"'\s]+)`)

// unavailable says which image the pod manifest at path names that is not
// in local storage and that CRI-O cannot pull either (through the node's
// mirror, or from its registry); nil when every image is there or can be
// had, or the manifest cannot be read (then nothing is known for good).
func (c client) unavailable(ctx context.Context, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		m := imageLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		spec := &cri.ImageSpec{Image: m[1]}
		st, err := c.im.ImageStatus(ctx, &cri.ImageStatusRequest{Image: spec})
		if err != nil || st.GetImage() != nil {
			continue
		}
		if _, err := c.im.PullImage(ctx, &cri.PullImageRequest{Image: spec}); err != nil && ctx.Err() == nil {
			return fmt.Errorf("image %s is not in local storage and cannot be pulled: %w", m[1], err)
		}
	}
	return nil
}

// findLogLine returns the first line of a CRI container log ending in
// suffix, or else the log's last line (or why it could not be read).
func findLogLine(path, suffix string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return err.Error(), false
	}
	defer f.Close()
	last := "empty log"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasSuffix(sc.Text(), suffix) {
			return sc.Text(), true
		}
		last = sc.Text()
	}
	return last, false
}

// pull is PullImage by name (through registries.conf and its mirrors), then
// ImageStatus: the image must be there with the locked digest.
func (c client) pull(ctx context.Context, name, digest string) bool {
	check := "cri-pull-" + short(name)
	start := time.Now()
	r, err := c.im.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: name}})
	if err != nil {
		msg := err.Error()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			msg = "timed out: " + msg
		}
		return report(check, false, "PullImage %s: %.300s", name, msg)
	}
	st, err := c.im.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: name}})
	if err != nil || st.Image == nil {
		return report(check, false, "ImageStatus after pull: %v (image %v)", err, st.GetImage())
	}
	if !slices.Contains(st.Image.RepoDigests, repo(name)+"@"+digest) {
		return report(check, false, "pulled %s has repo digests %q, want %s@%s", r.ImageRef, st.Image.RepoDigests, repo(name), digest)
	}
	return report(check, true, "%s in %s, pinned=%v", digest, time.Since(start).Round(time.Millisecond), st.Image.Pinned)
}

// absent checks that none of images (names or IDs) is in local storage.
func (c client) absent(ctx context.Context, check string, images []string) bool {
	var there []string
	for _, im := range images {
		st, err := c.im.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: im}})
		if err != nil {
			return report(check, false, "ImageStatus %s: %v", im, err)
		}
		if st.Image != nil {
			there = append(there, fmt.Sprintf("%s (%.19s pinned=%v)", im, st.Image.Id, st.Image.Pinned))
		}
	}
	if len(there) > 0 {
		return report(check, false, "still in local storage: %s", strings.Join(there, ", "))
	}
	return report(check, true, "none of %d images in local storage", len(images))
}

// pinned checks ImageStatus's pinned flag of name, which must have digest.
func (c client) pinned(ctx context.Context, check, name, digest string, want bool) bool {
	st, err := c.im.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: name}})
	if err != nil || st.Image == nil {
		return report(check, false, "ImageStatus %s: %v (image %v)", name, err, st.GetImage())
	}
	if !slices.Contains(st.Image.RepoDigests, repo(name)+"@"+digest) {
		return report(check, false, "%s has repo digests %q, want %s@%s", name, st.Image.RepoDigests, repo(name), digest)
	}
	return report(check, st.Image.Pinned == want, "%s pinned=%v (want %v)", name, st.Image.Pinned, want)
}
