package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The kubelet's one-off extension when a preStop hook uses up the grace period: the container
// still gets SIGTERM and this long before SIGKILL.
const minimumGraceAfterHook = 2 * time.Second

// checkLifecycle refuses, before the container starts, a hook this kubelet cannot run.
func checkLifecycle(c *corev1.Container) error {
	if c.Lifecycle == nil {
		return nil
	}
	if c.Lifecycle.PostStart != nil {
		return errors.New("lifecycle.postStart: podkubelet runs no postStart hook")
	}
	hook := c.Lifecycle.PreStop
	switch {
	case hook == nil, hook.Sleep != nil:
		return nil
	case hook.HTTPGet != nil:
		_, err := probePort(hook.HTTPGet.Port, c)
		return wrapProbe("lifecycle.preStop", err)
	}
	return errors.New("lifecycle.preStop: podkubelet runs sleep and httpGet hooks only (not exec or tcpSocket)")
}

// runPreStop runs the container's preStop hook, for at most grace, as the kubelet does before
// it sends SIGTERM: a terminating pod keeps serving while its endpoints go. It returns the
// grace left for the SIGTERM (at least minimumGraceAfterHook) and the hook's error, if any.
func runPreStop(c *corev1.Container, podIP string, grace time.Duration) (time.Duration, error) {
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		return grace, nil
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var err error
	switch hook := c.Lifecycle.PreStop; {
	case hook.Sleep != nil:
		select {
		case <-time.After(time.Duration(hook.Sleep.Seconds) * time.Second):
		case <-ctx.Done():
		}
	case hook.HTTPGet != nil:
		if err = httpProbe(ctx, hook.HTTPGet, c, podIP); err != nil {
			err = fmt.Errorf("preStop hook: %w", err)
		}
	}
	return max(grace-time.Since(began), minimumGraceAfterHook), err
}
