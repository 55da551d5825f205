package main

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podPhase derives the phase from the containers, as the kubelet does: Pending until each has
// started once, Running while any runs or will be restarted, then Succeeded when every one
// exited 0, else Failed.
func podPhase(statuses []corev1.ContainerStatus, policy corev1.RestartPolicy, deleting bool) corev1.PodPhase {
	running, waiting, succeeded, failed := 0, 0, 0, 0
	for _, s := range statuses {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			} else {
				failed++
			}
		case s.State.Waiting != nil && s.LastTerminationState.Terminated != nil:
			// Waiting to be restarted (back-off): it has run.
			running++
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case failed > 0:
		return corev1.PodFailed
	case succeeded > 0 && (policy != corev1.RestartPolicyAlways || deleting):
		return corev1.PodSucceeded
	case succeeded > 0:
		return corev1.PodRunning
	}
	return corev1.PodPending
}

// podConditions are the five conditions a kubelet maintains; each keeps its transition time
// while its status does not change.
func podConditions(previous []corev1.PodCondition, sandboxReady bool, statuses []corev1.ContainerStatus, now metav1.Time) []corev1.PodCondition {
	ready := len(statuses) > 0
	for _, s := range statuses {
		ready = ready && s.Ready
	}
	want := []struct {
		kind   corev1.PodConditionType
		status bool
		reason string
	}{
		{corev1.PodReadyToStartContainers, sandboxReady, ""},
		{corev1.PodInitialized, true, ""},
		{corev1.ContainersReady, ready, "ContainersNotReady"},
		{corev1.PodReady, ready, "ContainersNotReady"},
		{corev1.PodScheduled, true, ""},
	}
	conditions := make([]corev1.PodCondition, 0, len(want))
	for _, w := range want {
		cond := corev1.PodCondition{Type: w.kind, Status: corev1.ConditionFalse, LastTransitionTime: now}
		if w.status {
			cond.Status = corev1.ConditionTrue
		} else {
			cond.Reason = w.reason
		}
		for _, old := range previous {
			if old.Type == w.kind && old.Status == cond.Status {
				cond.LastTransitionTime = old.LastTransitionTime
			}
		}
		conditions = append(conditions, cond)
	}
	return conditions
}
