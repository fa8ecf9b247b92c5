// Command cri-check is the e2e appliance's CRI client: it talks to CRI-O
// over its socket with the calls kubelet makes (k8s.io/cri-api), to start the
// appliance's workload pod and to check what CRI-O reports. Check commands
// print one "KILN-E2E: <name> PASS|FAIL <detail>" line per check (the e2e
// console protocol) and exit 1 if any failed.
//
//	cri-check run POD IMAGE [ARG...]      start (or restart) pod POD running IMAGE;
//	                                      refuses to pull: the image must be in local storage
//	cri-check images NAME=DIGEST...       ListImages: each image present, with that digest, pinned
//	cri-check workload POD IMAGE DIGEST LINE
//	                                      the pod is ready, its container runs IMAGE by DIGEST and logged LINE
//	cri-check pull NAME DIGEST            PullImage by name, then ImageStatus: that digest
//	cri-check pinned CHECK NAME DIGEST true|false
//	                                      ImageStatus: the image (by that digest) is pinned, or not
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
	"path/filepath"
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
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: cri-check [-socket PATH] [-timeout D] run|images|workload|pull ARGS (see the source's doc comment)")
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
	case cmd == "run" && len(rest) >= 2:
		if err := c.run(ctx, rest[0], rest[1], rest[2:]); err != nil {
			fatal(err)
		}
	case cmd == "images" && len(rest) > 0:
		ok = c.images(ctx, rest)
	case cmd == "workload" && len(rest) == 4:
		ok = c.workload(ctx, rest[0], rest[1], rest[2], rest[3])
	case cmd == "pull" && len(rest) == 2:
		ok = c.pull(ctx, rest[0], rest[1])
	case cmd == "pinned" && len(rest) == 4 && (rest[3] == "true" || rest[3] == "false"):
		ok = c.pinned(ctx, rest[0], rest[1], rest[2], rest[3] == "true")
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

// run starts pod with one container of image, as kubelet does with
// imagePullPolicy: Never — ImageStatus first, and no PullImage at all. A pod
// of that name left from an earlier run is stopped and removed first, so
// the unit can run on every boot.
func (c client) run(ctx context.Context, pod, image string, args []string) error {
	st, err := c.im.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: image}})
	if err != nil {
		return fmt.Errorf("ImageStatus %s: %w", image, err)
	}
	if st.Image == nil {
		return fmt.Errorf("image %s is not in local storage; this workload never pulls (the preloaded store should have it)", image)
	}
	old, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		LabelSelector: map[string]string{"kiln-e2e/pod": pod}}})
	if err != nil {
		return fmt.Errorf("ListPodSandbox: %w", err)
	}
	for _, p := range old.Items {
		if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			return fmt.Errorf("stop old pod %s: %w", p.Id, err)
		}
		if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			return fmt.Errorf("remove old pod %s: %w", p.Id, err)
		}
	}
	logDir := filepath.Join("/var/log/pods", podNamespace+"_"+pod)
	// The log of an earlier run must not answer for this one.
	if err := os.Remove(filepath.Join(logDir, pod+".log")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the old container log: %w", err)
	}
	sbCfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: pod, Namespace: podNamespace, Uid: "kiln-e2e-" + pod},
		Hostname:     pod,
		LogDirectory: logDir,
		Labels:       map[string]string{"kiln-e2e/pod": pod},
		// As kubelet sets them for a pod without shareProcessNamespace:
		// network and IPC per pod, PID per container (then CRI-O runs no
		// infra container, drop_infra_ctr).
		Linux: &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{NamespaceOptions: &cri.NamespaceOption{
			Network: cri.NamespaceMode_POD, Ipc: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_CONTAINER}}},
	}
	// kubelet retries a failed sandbox with the next attempt number; so do
	// we, a few times (CRI-O cleans up a sandbox it failed to start).
	var sb *cri.RunPodSandboxResponse
	for attempt := uint32(0); ; attempt++ {
		sbCfg.Metadata.Attempt = attempt
		sb, err = c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: sbCfg})
		if err == nil {
			break
		}
		if attempt == 2 {
			return fmt.Errorf("RunPodSandbox %s, %d attempts: %w", pod, attempt+1, err)
		}
		fmt.Fprintf(os.Stderr, "cri-check: RunPodSandbox %s attempt %d: %v; retrying in 5s\n", pod, attempt, err)
		time.Sleep(5 * time.Second)
	}
	// CreateContainer is bounded per attempt and retried with the next
	// attempt number, as kubelet does (seen once on a TCG second boot: a
	// CreateContainer that never answered).
	var ctr *cri.CreateContainerResponse
	for attempt := uint32(0); ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		ctr, err = c.rt.CreateContainer(actx, &cri.CreateContainerRequest{
			PodSandboxId: sb.PodSandboxId,
			Config: &cri.ContainerConfig{
				Metadata: &cri.ContainerMetadata{Name: pod, Attempt: attempt},
				Image:    &cri.ImageSpec{Image: image},
				Args:     args,
				LogPath:  pod + ".log",
				Labels:   map[string]string{"kiln-e2e/pod": pod},
				Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{NamespaceOptions: &cri.NamespaceOption{
					Network: cri.NamespaceMode_POD, Ipc: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_CONTAINER}}},
			},
			SandboxConfig: sbCfg,
		})
		cancel()
		if err == nil {
			break
		}
		if attempt == 2 || ctx.Err() != nil {
			return fmt.Errorf("CreateContainer %s in pod %s, %d attempts: %w", image, pod, attempt+1, err)
		}
		fmt.Fprintf(os.Stderr, "cri-check: CreateContainer %s attempt %d: %v; retrying\n", image, attempt, err)
	}
	if _, err := c.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		return fmt.Errorf("StartContainer %s: %w", ctr.ContainerId, err)
	}
	fmt.Printf("pod %s (%s) container %s started from %s (image %s)\n", pod, sb.PodSandboxId, ctr.ContainerId, image, st.Image.Id)
	return nil
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

// workload checks the pod started by `run`: ready, its container running
// the image by digest, and the line the program printed in its CRI log.
func (c client) workload(ctx context.Context, pod, image, digest, line string) bool {
	sbs, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		LabelSelector: map[string]string{"kiln-e2e/pod": pod}}})
	if err != nil || len(sbs.Items) != 1 {
		return report("cri-workload", false, "pod %s: %d pods, err %v", pod, lenItems(sbs), err)
	}
	sb := sbs.Items[0]
	if sb.State != cri.PodSandboxState_SANDBOX_READY {
		return report("cri-workload", false, "pod %s is %s", pod, sb.State)
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

func lenItems(r *cri.ListPodSandboxResponse) int {
	if r == nil {
		return 0
	}
	return len(r.Items)
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
