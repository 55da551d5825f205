package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// checkProbe refuses, before the container starts, a probe this kubelet cannot run.
func checkProbe(kind string, p *corev1.Probe, c *corev1.Container) error {
	if p == nil {
		return nil
	}
	switch {
	case p.HTTPGet != nil:
		_, err := probePort(p.HTTPGet.Port, c)
		return wrapProbe(kind, err)
	case p.TCPSocket != nil:
		_, err := probePort(p.TCPSocket.Port, c)
		return wrapProbe(kind, err)
	}
	return fmt.Errorf("%s: podkubelet runs httpGet and tcpSocket probes only (not exec or grpc)", kind)
}

func wrapProbe(kind string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	return nil
}

// probePort resolves a number or the name of one of the container's ports.
func probePort(port intstr.IntOrString, c *corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return n, nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("port %q is not a named port of container %s", port.StrVal, c.Name)
}

// runProbe makes one attempt; nil is success.
func runProbe(ctx context.Context, p *corev1.Probe, c *corev1.Container, podIP string) error {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.HTTPGet != nil:
		return httpProbe(ctx, p.HTTPGet, c, podIP)
	case p.TCPSocket != nil:
		port, err := probePort(p.TCPSocket.Port, c)
		if err != nil {
			return err
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		var dialer net.Dialer
		conn, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return fmt.Errorf("unsupported probe")
}

func httpProbe(ctx context.Context, h *corev1.HTTPGetAction, c *corev1.Container, podIP string) error {
	port, err := probePort(h.Port, c)
	if err != nil {
		return err
	}
	host := h.Host
	if host == "" {
		host = podIP
	}
	scheme := "http"
	if h.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), h.Path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/podkubelet")
	for _, header := range h.HTTPHeaders {
		req.Header.Set(header.Name, header.Value)
	}
	// As the kubelet: HTTPS probes do not verify the certificate.
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
		DisableKeepAlives: true,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

// prober runs one probe on its period and reports each change of outcome after the
// success/failure threshold is reached.
type prober struct {
	probe     *corev1.Probe
	container *corev1.Container
	podIP     string
}

// run probes until ctx ends; onResult gets true/false when the thresholds are crossed. When
// stopOnSuccess, the first passing result ends it (a startup probe).
func (p prober) run(ctx context.Context, started time.Time, stopOnSuccess bool, onResult func(bool, error)) {
	delay := time.Until(started.Add(time.Duration(p.probe.InitialDelaySeconds) * time.Second))
	period := time.Duration(max(p.probe.PeriodSeconds, 1)) * time.Second
	success, failure := max(p.probe.SuccessThreshold, 1), max(p.probe.FailureThreshold, 1)
	timer := time.NewTimer(max(delay, 0))
	defer timer.Stop()
	var passes, fails int32
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		err := runProbe(ctx, p.probe, p.container, p.podIP)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			passes, fails = passes+1, 0
			if passes == success {
				onResult(true, nil)
				if stopOnSuccess {
					return
				}
			}
		} else {
			passes, fails = 0, fails+1
			if fails == failure {
				onResult(false, err)
			}
		}
		timer.Reset(period)
	}
}
