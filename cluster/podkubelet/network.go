package main

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
)

// podNetwork gives each pod a network namespace of its own, joined to a host-side bridge by a veth
// pair: the host owns the subnet's first address on the bridge, the pods the others. The host and
// every pod on this node reach each other; the bridge name is the prefix of every netns it owns,
// so a restarted kubelet finds and removes what a crashed one left.
type podNetwork struct {
	bridge  string
	subnet  *net.IPNet
	gateway net.IP

	mu   sync.Mutex
	used map[string]bool // addresses handed out
}

func newPodNetwork(bridge, cidr string) (*podNetwork, error) {
	if len(bridge) > 8 {
		return nil, fmt.Errorf("--bridge %q: at most 8 characters (netns and veth names extend it)", bridge)
	}
	ip, subnet, err := net.ParseCIDR(cidr)
	if err != nil || ip.To4() == nil {
		return nil, fmt.Errorf("--pod-cidr %q: not an IPv4 CIDR", cidr)
	}
	if ones, _ := subnet.Mask.Size(); ones < 16 || ones > 28 {
		return nil, fmt.Errorf("--pod-cidr %q: the prefix length must be between 16 and 28", cidr)
	}
	gateway := nthAddress(subnet, 1)
	return &podNetwork{bridge: bridge, subnet: subnet, gateway: gateway, used: map[string]bool{}}, nil
}

// nthAddress is the subnet's base address plus n.
func nthAddress(subnet *net.IPNet, n uint32) net.IP {
	base := subnet.IP.To4()
	value := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	value += n
	return net.IPv4(byte(value>>24), byte(value>>16), byte(value>>8), byte(value)).To4()
}

func ipCommand(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setUp creates the bridge (anew: leftovers of a crashed kubelet are removed first).
func (n *podNetwork) setUp() error {
	n.tearDown()
	prefix, _ := n.subnet.Mask.Size()
	steps := [][]string{
		{"link", "add", "name", n.bridge, "type", "bridge"},
		{"addr", "add", fmt.Sprintf("%s/%d", n.gateway, prefix), "dev", n.bridge},
		{"link", "set", n.bridge, "up"},
	}
	for _, step := range steps {
		if err := ipCommand(step...); err != nil {
			return err
		}
	}
	return nil
}

// tearDown removes every netns this bridge owns, then the bridge.
func (n *podNetwork) tearDown() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 && strings.HasPrefix(fields[0], n.bridge+"-") {
			_ = ipCommand("netns", "delete", fields[0])
		}
	}
	_ = exec.Command("ip", "link", "delete", n.bridge).Run()
}

// allocate hands out the lowest free address after the gateway.
func (n *podNetwork) allocate() (net.IP, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ones, bits := n.subnet.Mask.Size()
	size := uint32(1) << (bits - ones)
	for i := uint32(2); i < size-1; i++ {
		ip := nthAddress(n.subnet, i)
		if !n.used[ip.String()] {
			n.used[ip.String()] = true
			return ip, nil
		}
	}
	return nil, fmt.Errorf("pod CIDR %s has no free address", n.subnet)
}

func (n *podNetwork) release(ip net.IP) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.used, ip.String())
}

// namespaceFor names a pod's netns (and, with a "v", the host end of its veth: 15 characters at
// most) by the bridge and the address's last two bytes.
func (n *podNetwork) namespaceFor(ip net.IP) string {
	v4 := ip.To4()
	return fmt.Sprintf("%s-%d-%d", n.bridge, v4[2], v4[3])
}

// attach creates the pod's netns holding `ip` on its eth0, routed through the bridge.
func (n *podNetwork) attach(ip net.IP) (string, error) {
	ns := n.namespaceFor(ip)
	hostEnd := fmt.Sprintf("v%x%02x", ip.To4()[2], ip.To4()[3]) + n.bridge
	prefix, _ := n.subnet.Mask.Size()
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", hostEnd, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", hostEnd, "master", n.bridge, "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", ip, prefix), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "route", "add", "default", "via", n.gateway.String()},
	}
	for _, step := range steps {
		if err := ipCommand(step...); err != nil {
			_ = ipCommand("netns", "delete", ns)
			return "", err
		}
	}
	return ns, nil
}

// detach deletes the netns (which deletes the veth pair with it) and frees the address.
func (n *podNetwork) detach(ns string, ip net.IP) error {
	err := ipCommand("netns", "delete", ns)
	n.release(ip)
	return err
}
