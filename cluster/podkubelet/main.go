// podkubelet is a kubelet for the local control plane that runs pods as processes: a
// virtual-kubelet node (github.com/virtual-kubelet/virtual-kubelet, the CNCF project) whose
// provider gives each pod bound to it a network namespace of its own (a veth pair on a host
// bridge, holding the pod IP the API server shows) and runs each container's command there, with
// its probes, restarts and termination. There is no container runtime on this machine, hence no
// image: a file maps images to the command and environment they would give. See cluster/README.md.
//
//	podkubelet --node-name N --kubeconfig F --pod-cidr 10.245.1.0/24 --bridge ipk1 \
//	    --images images.json --state-dir DIR [--label k=v]... [--taint k=v:NoSchedule]...
//	podkubelet container-init SPEC.json   (internal: runs inside a pod's namespaces)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/log"
	logruslogger "github.com/virtual-kubelet/virtual-kubelet/log/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if len(os.Args) == 3 && os.Args[1] == "container-init" {
		err := containerInit(os.Args[2])
		fmt.Fprintf(os.Stderr, "podkubelet container-init: %v\n", err)
		os.Exit(128)
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "podkubelet: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	log.L = logruslogger.FromLogrus(logrus.NewEntry(logrus.StandardLogger()))
	var labels, taints listFlag
	nodeName := flag.String("node-name", "", "the Node's name (required)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server (required)")
	podCIDR := flag.String("pod-cidr", "", "this node's pod subnet, e.g. 10.245.1.0/24 (required)")
	bridge := flag.String("bridge", "", "name of the host bridge (at most 8 characters; required)")
	imagesPath := flag.String("images", "", "JSON file mapping images to entrypoint/cmd/env/workingDir (required)")
	stateDir := flag.String("state-dir", "", "where pod directories (emptyDir volumes, ...) go (required)")
	logDir := flag.String("log-dir", "", "where container logs go, kept after their pod (default: <state-dir>/logs)")
	cpu := flag.String("cpu", "16", "the node's cpu capacity")
	memory := flag.String("memory", "64Gi", "the node's memory capacity")
	maxPods := flag.String("pods", "110", "the node's pod capacity")
	backoff := flag.Duration("restart-backoff", 10*time.Second, "first restart delay after a container exits (doubles up to 5 min)")
	runAsRoot := flag.Bool("run-as-root", false, "run every container as root, whatever runAsUser says: for hosts whose programs other users cannot reach (logged once per pod)")
	flag.Var(&labels, "label", "a node label key=value (repeatable)")
	flag.Var(&taints, "taint", "a node taint key=value:Effect (repeatable)")
	flag.Parse()
	for name, value := range map[string]string{"--node-name": *nodeName, "--kubeconfig": *kubeconfig, "--pod-cidr": *podCIDR, "--bridge": *bridge, "--images": *imagesPath, "--state-dir": *stateDir} {
		if value == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if *logDir == "" {
		*logDir = *stateDir + "/logs"
	}
	images, err := loadImageMap(*imagesPath)
	if err != nil {
		return fmt.Errorf("--images: %w", err)
	}
	network, err := newPodNetwork(*bridge, *podCIDR)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	capacity := corev1.ResourceList{}
	for name, value := range map[corev1.ResourceName]string{corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *memory, corev1.ResourcePods: *maxPods} {
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return fmt.Errorf("--%s %q: %w", name, value, err)
		}
		capacity[name] = q
	}
	nodeTaints, err := parseTaints(taints)
	if err != nil {
		return err
	}
	nodeLabels := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--label %q: want key=value", l)
		}
		nodeLabels[k] = v
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	if err := network.setUp(); err != nil {
		return err
	}
	defer network.tearDown()

	// nodeutil.NewNode makes a default client from $KUBECONFIG before it takes ours.
	_ = os.Setenv("KUBECONFIG", *kubeconfig)
	var provider *processProvider
	n, err := nodeutil.NewNode(*nodeName, func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		describeNode(pc.Node, nodeLabels, nodeTaints, capacity, network.gateway.String())
		provider = &processProvider{
			node:       pc.Node,
			network:    network,
			images:     images,
			imagesPath: *imagesPath,
			volumes:    volumePreparer{client: client, objects: objectSource{configMaps: pc.ConfigMaps, secrets: pc.Secrets}},
			stateDir:   *stateDir,
			logDir:     *logDir,
			self:       self,
			backoff:    backoffPolicy{initial: *backoff, max: 5 * time.Minute, resetAfter: 10 * time.Minute},
			pods:       map[string]*podRuntime{},
			runAsRoot:  *runAsRoot,
		}
		return provider, nil, nil
	}, nodeutil.WithClient(client), func(cfg *nodeutil.NodeConfig) error {
		// status.podIP is known only once the pod's network exists: resolved by the provider.
		cfg.SkipDownwardAPIResolution = true
		cfg.NumWorkers = 4
		return nil
	})
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go func() {
		if err := n.Run(ctx); err != nil && ctx.Err() == nil {
			log.G(ctx).Errorf("node: %v", err)
			cancel()
		}
	}()
	if err := n.WaitReady(ctx, time.Minute); err != nil {
		return err
	}
	log.G(ctx).Infof("node %s ready; pods in %s on bridge %s", *nodeName, *podCIDR, *bridge)
	go provider.refreshHosts(ctx)
	<-ctx.Done()
	provider.stopAll(5 * time.Second)
	return nil
}

func describeNode(n *corev1.Node, labels map[string]string, taints []corev1.Taint, capacity corev1.ResourceList, address string) {
	for k, v := range labels {
		n.Labels[k] = v
	}
	n.Labels[corev1.LabelOSStable] = "linux"
	n.Spec.Taints = taints
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: address}}
	n.Status.NodeInfo.OperatingSystem = "linux"
	n.Status.NodeInfo.Architecture = "amd64"
	n.Status.NodeInfo.KubeletVersion = "podkubelet (virtual-kubelet v1.14.1)"
}

func parseTaints(specs []string) ([]corev1.Taint, error) {
	var taints []corev1.Taint
	for _, spec := range specs {
		keyValue, effect, ok := strings.Cut(spec, ":")
		key, value, _ := strings.Cut(keyValue, "=")
		switch corev1.TaintEffect(effect) {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			ok = false
		}
		if !ok || key == "" {
			return nil, fmt.Errorf("--taint %q: want key[=value]:NoSchedule|PreferNoSchedule|NoExecute", spec)
		}
		taints = append(taints, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)})
	}
	return taints, nil
}
