package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/log"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Name resolution for a pod, as the kubelet and cluster DNS would give it: this control plane
// has neither a DNS server nor kube-proxy, so each pod's /etc/hosts (a file of the pod's directory
// bind-mounted over the host's in its mount namespace) names the pod itself and every Service of
// its namespace, under `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc` and `<svc>.<ns>.svc.cluster.local`.
//
// A name resolves to the Service's ClusterIP, as cluster DNS answers; with no kube-proxy nothing
// forwards it. A Service annotated `podkubelet.infernetes.io/backend: host` resolves to the pod's
// host address instead (the node's bridge address): its backend is a program a test runs on this
// machine, listening on every address (the endpoint picker, whose own pod runs on no serving
// node). Headless Services are left out. The file is rewritten in place while the pod runs, so a
// Service created or annotated later is seen.

const (
	hostBackendAnnotation = "podkubelet.infernetes.io/backend"
	hostBackend           = "host"
	clusterDomain         = "cluster.local"
	hostsRefreshPeriod    = 2 * time.Second
)

// hostsFile is a pod's /etc/hosts: the kubelet's lines for the pod, then one line per Service.
func hostsFile(pod *corev1.Pod, podIP, hostIP string, services []corev1.Service) []byte {
	var b bytes.Buffer
	b.WriteString("# Kubernetes-managed hosts file (podkubelet: the Services of the namespace too).\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	b.WriteString("fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if podIP != "" {
		fmt.Fprintf(&b, "%s\t%s\n", podIP, hostname)
	}
	sorted := append([]corev1.Service(nil), services...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, svc := range sorted {
		address := serviceAddress(&svc, hostIP)
		if address == "" {
			continue
		}
		ns := svc.Namespace
		fmt.Fprintf(&b, "%s\t%s %s.%s %s.%s.svc %s.%s.svc.%s\n",
			address, svc.Name, svc.Name, ns, svc.Name, ns, svc.Name, ns, clusterDomain)
	}
	return b.Bytes()
}

// serviceAddress is the address a Service's names resolve to in a pod; "" leaves it out.
func serviceAddress(svc *corev1.Service, hostIP string) string {
	if svc.Annotations[hostBackendAnnotation] == hostBackend {
		return hostIP
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return ""
	}
	return svc.Spec.ClusterIP
}

func (r *podRuntime) hostsPath() string {
	return filepath.Join(r.dir(), "etc-hosts")
}

// writeHosts writes the pod's hosts file when its content changed (in place: the bind mount in
// the pod's mount namespace holds the inode).
func (r *podRuntime) writeHosts(services []corev1.Service) error {
	r.mu.Lock()
	pod, ip := r.pod, r.ip
	r.mu.Unlock()
	podIP := ""
	if ip != nil {
		podIP = ip.String()
	}
	content := hostsFile(pod, podIP, r.provider.network.gateway.String(), services)
	path := r.hostsPath()
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, content) {
		return nil
	}
	// No MkdirAll: a pod being removed has lost its directory, and keeps it lost.
	return os.WriteFile(path, content, 0o644)
}

// hostsMount bind-mounts the hosts file over /etc/hosts, unless the container mounts a volume
// there itself.
func hostsMount(path string, mounts []bindMount) []bindMount {
	for _, m := range mounts {
		if filepath.Clean(m.Target) == "/etc/hosts" || filepath.Clean(m.Target) == "/etc" {
			return nil
		}
	}
	return []bindMount{{Source: path, Target: "/etc/hosts", ReadOnly: true}}
}

// namespaceServices lists a namespace's Services.
func (p *processProvider) namespaceServices(ctx context.Context, namespace string) ([]corev1.Service, error) {
	list, err := p.volumes.client.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the Services of %s: %w", namespace, err)
	}
	return list.Items, nil
}

// refreshHosts rewrites every running pod's hosts file from its namespace's Services, until ctx
// ends.
func (p *processProvider) refreshHosts(ctx context.Context) {
	ticker := time.NewTicker(hostsRefreshPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		p.mu.Lock()
		pods := make([]*podRuntime, 0, len(p.pods))
		for _, r := range p.pods {
			pods = append(pods, r)
		}
		p.mu.Unlock()
		byNamespace := map[string][]corev1.Service{}
		for _, r := range pods {
			r.mu.Lock()
			namespace, live := r.pod.Namespace, r.netns != "" && !r.deleting
			r.mu.Unlock()
			if !live {
				continue
			}
			services, ok := byNamespace[namespace]
			if !ok {
				var err error
				if services, err = p.namespaceServices(ctx, namespace); err != nil {
					log.G(ctx).Warnf("%v", err)
					continue
				}
				byNamespace[namespace] = services
			}
			if err := r.writeHosts(services); err != nil && !os.IsNotExist(err) {
				log.G(ctx).Warnf("pod %s: hosts file: %v", describe(r.pod), err)
			}
		}
	}
}
