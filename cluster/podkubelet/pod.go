package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/log"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// backoffPolicy is the restart delay after a container exits: doubling from initial up to max,
// reset after a container ran for resetAfter (the kubelet's 10 s, 5 min and 10 min).
type backoffPolicy struct {
	initial, max, resetAfter time.Duration
}

// podRuntime is one pod on this node: its netns, its volumes and one supervised process per
// container. Every status change is published to the pod controller.
type podRuntime struct {
	provider *processProvider
	ctx      context.Context // ends when the pod is being deleted
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the container loops
	stopOnce sync.Once
	setUp    chan struct{} // closed once start has set up (or failed to set up) the pod

	mu         sync.Mutex
	pod        *corev1.Pod
	ip         net.IP
	netns      string
	startTime  *metav1.Time
	deleting   bool
	containers []*containerRuntime
}

type containerRuntime struct {
	spec    corev1.Container
	launch  launchSpec
	status  corev1.ContainerStatus
	process *os.Process
}

func newPodRuntime(p *processProvider, pod *corev1.Pod) *podRuntime {
	ctx, cancel := context.WithCancel(context.Background())
	r := &podRuntime{provider: p, ctx: ctx, cancel: cancel, pod: pod, setUp: make(chan struct{})}
	for _, c := range pod.Spec.Containers {
		r.containers = append(r.containers, &containerRuntime{
			spec: c,
			status: corev1.ContainerStatus{
				Name:  c.Name,
				Image: c.Image,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
			},
		})
	}
	return r
}

func (r *podRuntime) uid() types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pod.UID
}

func (r *podRuntime) dir() string {
	return filepath.Join(r.provider.stateDir, "pods", fmt.Sprintf("%s_%s_%s", r.pod.Namespace, r.pod.Name, r.pod.UID))
}

// logPath keeps the logs apart from the pod's directory, which goes with the pod.
func (r *podRuntime) logPath(container string) string {
	return filepath.Join(r.provider.logDir, fmt.Sprintf("%s_%s_%s", r.pod.Namespace, r.pod.Name, r.pod.UID), container+".log")
}

func (r *podRuntime) updateSpec(pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	status := r.pod.Status
	r.pod = pod.DeepCopy()
	r.pod.Status = status
}

// snapshot is the pod with its current status (a copy the caller may keep).
func (r *podRuntime) snapshot() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snapshotLocked()
}

func (r *podRuntime) snapshotLocked() *corev1.Pod {
	pod := r.pod.DeepCopy()
	statuses := make([]corev1.ContainerStatus, 0, len(r.containers))
	for _, c := range r.containers {
		statuses = append(statuses, *c.status.DeepCopy())
	}
	now := metav1.Now()
	pod.Status.Phase = podPhase(statuses, pod.Spec.RestartPolicy, r.deleting)
	pod.Status.Conditions = podConditions(r.pod.Status.Conditions, r.netns != "", statuses, now)
	r.pod.Status.Conditions = pod.Status.Conditions
	pod.Status.ContainerStatuses = statuses
	pod.Status.HostIP = r.provider.network.gateway.String()
	pod.Status.HostIPs = []corev1.HostIP{{IP: pod.Status.HostIP}}
	pod.Status.StartTime = r.startTime
	if r.ip != nil {
		pod.Status.PodIP = r.ip.String()
		pod.Status.PodIPs = []corev1.PodIP{{IP: r.ip.String()}}
	}
	pod.Status.Reason, pod.Status.Message = "", ""
	return pod
}

func (r *podRuntime) publish() {
	r.provider.publish(r.snapshot())
}

// start sets up the network and volumes, then supervises each container. A set-up failure is
// reported on every container as the kubelet reports it (waiting, with the reason) and the pod
// stays Pending.
func (r *podRuntime) start(ctx context.Context) {
	// stop waits for this, so that nothing it has removed is created after it.
	defer close(r.setUp)
	now := metav1.Now()
	r.mu.Lock()
	r.startTime = &now
	r.mu.Unlock()
	r.publish()
	reason, err := r.prepare(ctx)
	if err != nil {
		log.G(ctx).Warnf("pod %s: %v", describe(r.pod), err)
		r.mu.Lock()
		for _, c := range r.containers {
			c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: err.Error()}}
		}
		r.mu.Unlock()
		r.publish()
		return
	}
	r.publish()
	for _, c := range r.containers {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.supervise(c)
		}()
	}
}

func (r *podRuntime) prepare(ctx context.Context) (string, error) {
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	r.mu.Unlock()
	if len(pod.Spec.InitContainers) > 0 || len(pod.Spec.EphemeralContainers) > 0 {
		return "CreateContainerConfigError", errors.New("podkubelet runs no init or ephemeral containers")
	}
	ip, err := r.provider.network.allocate()
	if err != nil {
		return "CreateContainerError", err
	}
	netns, err := r.provider.network.attach(ip)
	if err != nil {
		r.provider.network.release(ip)
		return "CreateContainerError", err
	}
	r.mu.Lock()
	r.ip, r.netns = ip, netns
	r.mu.Unlock()
	facts := podFacts{podIP: ip.String(), hostIP: r.provider.network.gateway.String()}
	volumes, err := r.provider.volumes.prepare(ctx, pod, facts, r.dir())
	if err != nil {
		return "CreateContainerConfigError", err
	}
	services, err := r.provider.namespaceServices(ctx, pod.Namespace)
	if err != nil {
		return "CreateContainerError", err
	}
	if err := os.MkdirAll(r.dir(), 0o755); err != nil {
		return "CreateContainerError", err
	}
	if err := r.writeHosts(services); err != nil {
		return "CreateContainerError", fmt.Errorf("hosts file: %w", err)
	}
	for _, c := range r.containers {
		launch, reason, err := r.launchSpec(pod, &c.spec, facts, volumes)
		if err != nil {
			return reason, fmt.Errorf("container %s: %w", c.spec.Name, err)
		}
		c.launch = launch
	}
	return "", nil
}

func (r *podRuntime) launchSpec(pod *corev1.Pod, c *corev1.Container, facts podFacts, volumes map[string]string) (launchSpec, string, error) {
	image, ok := r.provider.images.lookup(c.Image)
	if !ok {
		return launchSpec{}, "ErrImagePull", fmt.Errorf("image %q is not in the image map %s", c.Image, r.provider.imagesPath)
	}
	for kind, probe := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe} {
		if err := checkProbe(kind, probe, c); err != nil {
			return launchSpec{}, "CreateContainerConfigError", err
		}
	}
	if err := checkLifecycle(c); err != nil {
		return launchSpec{}, "CreateContainerConfigError", err
	}
	env, values, err := containerEnv(pod, c, r.provider.node, facts, image, r.provider.volumes.objects)
	if err != nil {
		return launchSpec{}, "CreateContainerConfigError", err
	}
	argv := image.argv(c.Command, c.Args)
	for i := range argv {
		argv[i] = expandReferences(argv[i], values)
	}
	if len(argv) == 0 {
		return launchSpec{}, "CreateContainerConfigError", errors.New("no command: neither the container nor its image map entry gives one")
	}
	spec := launchSpec{Argv: argv, Env: env, WorkingDir: c.WorkingDir}
	if creds := credentialsFor(pod, c); creds != nil && r.provider.runAsRoot {
		log.G(r.ctx).Warnf("pod %s container %s: runs as root, not as uid %d (--run-as-root)", describe(pod), c.Name, creds.UID)
	} else {
		spec.User = creds
	}
	if spec.WorkingDir == "" {
		spec.WorkingDir = image.WorkingDir
	}
	for _, m := range c.VolumeMounts {
		source, ok := volumes[m.Name]
		if !ok {
			return launchSpec{}, "CreateContainerConfigError", fmt.Errorf("volumeMount %q names no volume of the pod", m.Name)
		}
		if m.SubPath != "" {
			source = filepath.Join(source, m.SubPath)
			if err := os.MkdirAll(source, 0o777); err != nil {
				return launchSpec{}, "CreateContainerConfigError", err
			}
		}
		spec.Mounts = append(spec.Mounts, bindMount{Source: source, Target: m.MountPath, ReadOnly: m.ReadOnly || readOnlyVolume(pod, m.Name)})
	}
	spec.Mounts = append(spec.Mounts, hostsMount(r.hostsPath(), spec.Mounts)...)
	spec.Mounts = append(spec.Mounts, keptMounts(image.Keep, spec.Mounts)...)
	return spec, "", nil
}

// keptMounts binds each kept directory on itself when a volume is mounted above it (the mounts
// go parents first, so it lands on top of that volume).
func keptMounts(keep []string, mounts []bindMount) []bindMount {
	var kept []bindMount
	for _, dir := range keep {
		for _, m := range mounts {
			if target := filepath.Clean(m.Target); dir != target && strings.HasPrefix(dir, target+"/") {
				kept = append(kept, bindMount{Source: dir, Target: dir, ReadOnly: true})
				break
			}
		}
	}
	return kept
}

func readOnlyVolume(pod *corev1.Pod, name string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly ||
				v.HostPath == nil && v.EmptyDir == nil && v.PersistentVolumeClaim == nil // configMap, secret, projected
		}
	}
	return false
}

// credentialsFor is the user the container runs as: runAsUser/runAsGroup of the container, else
// of the pod, with fsGroup and supplementalGroups as extra groups; nil keeps root.
func credentialsFor(pod *corev1.Pod, c *corev1.Container) *credentials {
	var uid, gid *int64
	if s := pod.Spec.SecurityContext; s != nil {
		uid, gid = s.RunAsUser, s.RunAsGroup
	}
	if s := c.SecurityContext; s != nil {
		if s.RunAsUser != nil {
			uid = s.RunAsUser
		}
		if s.RunAsGroup != nil {
			gid = s.RunAsGroup
		}
	}
	if uid == nil {
		return nil
	}
	creds := &credentials{UID: uint32(*uid), GID: uint32(*uid)}
	if gid != nil {
		creds.GID = uint32(*gid)
	}
	if s := pod.Spec.SecurityContext; s != nil {
		if s.FSGroup != nil {
			creds.Groups = append(creds.Groups, uint32(*s.FSGroup))
		}
		for _, g := range s.SupplementalGroups {
			creds.Groups = append(creds.Groups, uint32(g))
		}
	}
	return creds
}

// supervise runs the container, restarts it as the restart policy says, with back-off, and
// records every state change.
func (r *podRuntime) supervise(c *containerRuntime) {
	backoff := r.provider.backoff.initial
	for {
		started := time.Now()
		exitCode, signal, err := r.runOnce(c)
		finished := time.Now()
		if time.Since(started) > r.provider.backoff.resetAfter {
			backoff = r.provider.backoff.initial
		}
		terminated := &corev1.ContainerStateTerminated{
			ExitCode:   int32(exitCode),
			Signal:     int32(signal),
			Reason:     "Completed",
			StartedAt:  metav1.NewTime(started),
			FinishedAt: metav1.NewTime(finished),
		}
		if exitCode != 0 {
			terminated.Reason = "Error"
		}
		if err != nil {
			terminated.Reason, terminated.Message, terminated.ExitCode = "StartError", err.Error(), 128
		} else if exitCode != 0 && c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
			terminated.Message = logTail(r.logPath(c.spec.Name))
		}
		r.mu.Lock()
		restart := !r.deleting && restarts(r.pod.Spec.RestartPolicy, int(terminated.ExitCode))
		c.status.Ready, c.status.Started = false, ptr(false)
		c.process = nil
		if !restart {
			c.status.State = corev1.ContainerState{Terminated: terminated}
			r.mu.Unlock()
			r.publish()
			return
		}
		c.status.LastTerminationState = corev1.ContainerState{Terminated: terminated}
		c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", backoff, c.spec.Name, r.pod.Name, r.pod.Namespace, r.pod.UID),
		}}
		r.mu.Unlock()
		r.publish()
		select {
		case <-r.ctx.Done():
			r.mu.Lock()
			c.status.State = corev1.ContainerState{Terminated: terminated}
			r.mu.Unlock()
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, r.provider.backoff.max)
		r.mu.Lock()
		c.status.RestartCount++
		r.mu.Unlock()
	}
}

func restarts(policy corev1.RestartPolicy, exitCode int) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	}
	return true
}

func ptr[T any](v T) *T { return &v }

// runOnce starts the container's process in the pod's namespaces, runs its probes, and waits for
// it to exit. A process ended by a signal exits 128+signal, as a container runtime reports it.
func (r *podRuntime) runOnce(c *containerRuntime) (int, int, error) {
	logPath := r.logPath(c.spec.Name)
	specPath := filepath.Join(r.dir(), "containers", c.spec.Name+".json")
	if err := writeJSON(specPath, c.launch); err != nil {
		return 0, 0, err
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return 0, 0, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, 0, err
	}
	defer logFile.Close()
	cmd := exec.Command("ip", "netns", "exec", r.netns, r.provider.self, "container-init", specPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = []string{} // the container's environment comes from its launch spec only
	// A group of its own: deletion signals everything the container started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.mu.Lock()
	if r.deleting {
		r.mu.Unlock()
		return 0, 0, errors.New("the pod is being deleted")
	}
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		return 0, 0, err
	}
	c.process = cmd.Process
	c.status.ContainerID = fmt.Sprintf("podkubelet://%d", cmd.Process.Pid)
	c.status.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	c.status.Started = ptr(c.spec.StartupProbe == nil)
	ip := r.ip.String()
	r.mu.Unlock()
	r.publish()

	probeCtx, stopProbes := context.WithCancel(r.ctx)
	go r.probe(probeCtx, c, ip, time.Now())
	err = cmd.Wait()
	stopProbes()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return 0, 0, err
	}
	status := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if status.Signaled() {
		return 128 + int(status.Signal()), int(status.Signal()), nil
	}
	return status.ExitStatus(), 0, nil
}

// probe runs the startup probe, then readiness and liveness, as the kubelet orders them.
func (r *podRuntime) probe(ctx context.Context, c *containerRuntime, ip string, started time.Time) {
	spec := c.spec
	if spec.StartupProbe != nil {
		passed := make(chan struct{})
		go prober{spec.StartupProbe, &spec, ip}.run(ctx, started, true, func(ok bool, err error) {
			if ok {
				close(passed)
			} else {
				r.kill(c, fmt.Sprintf("startup probe failed: %v", err))
			}
		})
		select {
		case <-ctx.Done():
			return
		case <-passed:
		}
		r.mu.Lock()
		c.status.Started = ptr(true)
		r.mu.Unlock()
		r.publish()
	}
	if spec.LivenessProbe != nil {
		go prober{spec.LivenessProbe, &spec, ip}.run(ctx, started, false, func(ok bool, err error) {
			if !ok {
				r.kill(c, fmt.Sprintf("liveness probe failed: %v", err))
			}
		})
	}
	setReady := func(ready bool) {
		r.mu.Lock()
		changed := c.status.Ready != ready && ctx.Err() == nil
		if changed {
			c.status.Ready = ready
		}
		r.mu.Unlock()
		if changed {
			r.publish()
		}
	}
	if spec.ReadinessProbe == nil {
		setReady(true)
		return
	}
	// After a startup probe passes, readiness is probed at once (the kubelet does the same).
	readiness := *spec.ReadinessProbe
	if spec.StartupProbe != nil {
		started = time.Now().Add(-time.Duration(readiness.InitialDelaySeconds) * time.Second)
	}
	prober{&readiness, &spec, ip}.run(ctx, started, false, func(ok bool, _ error) { setReady(ok) })
}

// kill ends a container whose probe failed: its preStop hook, SIGTERM, then SIGKILL at the end
// of the grace period.
func (r *podRuntime) kill(c *containerRuntime, why string) {
	r.mu.Lock()
	process := c.process
	grace := 30 * time.Second
	if g := r.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	r.mu.Unlock()
	if process == nil {
		return
	}
	log.G(r.ctx).Infof("pod %s container %s: %s; killing it", describe(r.pod), c.spec.Name, why)
	go r.stopContainer(&c.spec, process.Pid, grace)
}

// stopContainer runs the container's preStop hook, then terminates its process group with the
// grace left.
func (r *podRuntime) stopContainer(c *corev1.Container, pgid int, grace time.Duration) {
	r.mu.Lock()
	ip := r.ip.String()
	r.mu.Unlock()
	left, err := runPreStop(c, ip, grace)
	if err != nil {
		log.G(r.ctx).Warnf("pod %s container %s: %v", describe(r.pod), c.Name, err)
	}
	terminate(pgid, left)
}

// terminate signals the process group, then kills it when it is still there after grace.
func terminate(pgid int, grace time.Duration) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if syscall.Kill(-pgid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// stop ends the pod: every container runs its preStop hook, then gets SIGTERM and, at the end of
// the grace period, SIGKILL; then
// its netns and directory go, and the terminal status is published.
func (r *podRuntime) stop(grace time.Duration) {
	r.stopOnce.Do(func() {
		r.mu.Lock()
		r.deleting = true
		r.mu.Unlock()
		<-r.setUp
		r.mu.Lock()
		groups := map[int]*corev1.Container{}
		for _, c := range r.containers {
			if c.process != nil {
				groups[c.process.Pid] = &c.spec
			}
			if c.status.State.Running == nil && c.status.State.Terminated == nil {
				// Never started, or waiting to restart: ends without another run.
				last := c.status.LastTerminationState.Terminated
				if last == nil {
					// What the kubelet reports for a container that never ran.
					last = &corev1.ContainerStateTerminated{
						ExitCode: 137,
						Reason:   "ContainerStatusUnknown",
						Message:  "The container could not be located when the pod was deleted.",
					}
				}
				c.status.State = corev1.ContainerState{Terminated: last}
			}
		}
		r.mu.Unlock()
		r.cancel()
		var wg sync.WaitGroup
		for pgid, spec := range groups {
			wg.Add(1)
			go func() { defer wg.Done(); r.stopContainer(spec, pgid, grace) }()
		}
		wg.Wait()
		r.wg.Wait()
		r.mu.Lock()
		if r.netns != "" {
			if err := r.provider.network.detach(r.netns, r.ip); err != nil {
				log.G(r.ctx).Warnf("pod %s: %v", describe(r.pod), err)
			}
			r.netns = ""
		}
		r.mu.Unlock()
		_ = os.RemoveAll(r.dir())
		r.publish()
	})
}

// logTail is the termination message FallbackToLogsOnError gives: the log's last 80 lines, at
// most 2048 bytes (the kubelet's limits).
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	text := strings.Join(lines, "\n")
	if len(text) > 2048 {
		text = text[len(text)-2048:]
	}
	return text
}
