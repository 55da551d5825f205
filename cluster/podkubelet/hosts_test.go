package main

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(name, clusterIP string, annotations map[string]string) corev1.Service {
	return corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Annotations: annotations},
		Spec:       corev1.ServiceSpec{ClusterIP: clusterIP},
	}
}

func TestHostsFileNamesThePodAndTheNamespacesServices(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "ns"}}
	services := []corev1.Service{
		service("picker", "10.96.0.20", map[string]string{hostBackendAnnotation: hostBackend}),
		service("api", "10.96.0.10", nil),
		service("headless", corev1.ClusterIPNone, nil),
	}
	got := string(hostsFile(pod, "10.245.1.2", "10.245.1.1", services))
	for _, line := range []string{
		"127.0.0.1\tlocalhost",
		"10.245.1.2\tweb-0",
		"10.96.0.10\tapi api.ns api.ns.svc api.ns.svc.cluster.local",
		// Its backend runs on the host: the pod's host address, not its ClusterIP.
		"10.245.1.1\tpicker picker.ns picker.ns.svc picker.ns.svc.cluster.local",
	} {
		if !strings.Contains(got, line+"\n") {
			t.Errorf("missing %q in\n%s", line, got)
		}
	}
	if strings.Contains(got, "headless") || strings.Contains(got, "10.96.0.20") {
		t.Errorf("a headless Service or a host-backed Service's ClusterIP is listed:\n%s", got)
	}
	// Services in name order: the file does not change with the API server's listing order.
	if strings.Index(got, "\tapi ") > strings.Index(got, "\tpicker ") {
		t.Errorf("Services out of order:\n%s", got)
	}
}

func TestHostsFileUsesThePodsHostname(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0"}, Spec: corev1.PodSpec{Hostname: "leader"}}
	if got := string(hostsFile(pod, "10.245.1.3", "10.245.1.1", nil)); !strings.Contains(got, "10.245.1.3\tleader\n") {
		t.Errorf("no hostname line in\n%s", got)
	}
}

func TestHostsMountGivesWayToTheContainersOwn(t *testing.T) {
	if got := hostsMount("/pod/etc-hosts", nil); len(got) != 1 || got[0].Target != "/etc/hosts" || !got[0].ReadOnly {
		t.Errorf("hostsMount = %+v", got)
	}
	own := []bindMount{{Source: "/vol", Target: "/etc/hosts/"}}
	if got := hostsMount("/pod/etc-hosts", own); got != nil {
		t.Errorf("hostsMount over a container's own /etc/hosts = %+v", got)
	}
}
