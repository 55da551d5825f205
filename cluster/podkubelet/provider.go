package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/log"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// processProvider is the virtual-kubelet provider: each pod bound to the node is a network
// namespace and one process per container (see pod.go).
type processProvider struct {
	node       *corev1.Node
	network    *podNetwork
	images     imageMap
	imagesPath string
	volumes    volumePreparer
	stateDir   string
	logDir     string
	self       string // this executable, run as `container-init` inside each pod
	backoff    backoffPolicy
	runAsRoot  bool // securityContext users are not applied (see --run-as-root)

	mu     sync.Mutex
	pods   map[string]*podRuntime
	notify func(*corev1.Pod)
}

func podKey(namespace, name string) string { return namespace + "/" + name }

func (p *processProvider) NotifyPods(_ context.Context, notify func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notify = notify
}

func (p *processProvider) publish(pod *corev1.Pod) {
	p.mu.Lock()
	notify := p.notify
	p.mu.Unlock()
	if notify != nil {
		notify(pod)
	}
}

func (p *processProvider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	if existing, ok := p.pods[key]; ok && existing.uid() == pod.UID {
		p.mu.Unlock()
		return nil
	}
	r := newPodRuntime(p, pod.DeepCopy())
	p.pods[key] = r
	p.mu.Unlock()
	// Started apart from the pod controller's worker: a pod's set-up must not hold up others.
	go r.start(context.WithoutCancel(ctx))
	return nil
}

// UpdatePod: a running pod's spec changes only in what this kubelet does not act on (the API
// server allows image changes, which take effect at the next restart; labels, annotations).
func (p *processProvider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	if r := p.lookup(pod.Namespace, pod.Name); r != nil {
		r.updateSpec(pod)
	}
	return nil
}

func (p *processProvider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	r := p.lookup(pod.Namespace, pod.Name)
	if r == nil {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	grace := time.Duration(30) * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	go func() {
		ctx := context.WithoutCancel(ctx)
		r.stop(grace)
		p.mu.Lock()
		if p.pods[podKey(pod.Namespace, pod.Name)] == r {
			delete(p.pods, podKey(pod.Namespace, pod.Name))
		}
		p.mu.Unlock()
		log.G(ctx).Infof("pod %s stopped", describe(pod))
		// As the kubelet does once every container has ended: the pod object goes now, not
		// when the grace period (which virtual-kubelet waits out otherwise) is over.
		options := metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0)), Preconditions: metav1.NewUIDPreconditions(string(pod.UID))}
		err := p.volumes.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, options)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			log.G(ctx).Warnf("pod %s: deleting the stopped pod: %v", describe(pod), err)
		}
	}()
	return nil
}

func (p *processProvider) lookup(namespace, name string) *podRuntime {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[podKey(namespace, name)]
}

func (p *processProvider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	r := p.lookup(namespace, name)
	if r == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return r.snapshot(), nil
}

func (p *processProvider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p *processProvider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	runtimes := make([]*podRuntime, 0, len(p.pods))
	for _, r := range p.pods {
		runtimes = append(runtimes, r)
	}
	p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(runtimes))
	for _, r := range runtimes {
		pods = append(pods, r.snapshot())
	}
	return pods, nil
}

// GetContainerLogs reads the container's log file (the kubelet API is not served: see README).
func (p *processProvider) GetContainerLogs(_ context.Context, namespace, name, container string, _ api.ContainerLogOpts) (io.ReadCloser, error) {
	r := p.lookup(namespace, name)
	if r == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return os.Open(r.logPath(container))
}

var errNotSupported = errdefs.InvalidInput("not supported by podkubelet")

func (p *processProvider) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errNotSupported
}

func (p *processProvider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errNotSupported
}

func (p *processProvider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errNotSupported
}

func (p *processProvider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errNotSupported
}

func (p *processProvider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errNotSupported
}

// stopAll ends every pod (the kubelet is shutting down and takes its network with it).
func (p *processProvider) stopAll(grace time.Duration) {
	p.mu.Lock()
	runtimes := make([]*podRuntime, 0, len(p.pods))
	for _, r := range p.pods {
		runtimes = append(runtimes, r)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range runtimes {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop(grace) }()
	}
	wg.Wait()
}

func writeJSON(path string, value any) error {
	data, err := json.Marshal(value)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

func describe(pod *corev1.Pod) string { return fmt.Sprintf("%s/%s", pod.Namespace, pod.Name) }
