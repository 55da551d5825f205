package main

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func running() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}

func exited(code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}

func backingOff() corev1.ContainerStatus {
	return corev1.ContainerStatus{
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}},
	}
}

func creating() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
}

func TestPodPhase(t *testing.T) {
	cases := []struct {
		name     string
		statuses []corev1.ContainerStatus
		policy   corev1.RestartPolicy
		deleting bool
		want     corev1.PodPhase
	}{
		{"not started yet", []corev1.ContainerStatus{creating()}, corev1.RestartPolicyAlways, false, corev1.PodPending},
		{"one of two not started", []corev1.ContainerStatus{running(), creating()}, corev1.RestartPolicyAlways, false, corev1.PodPending},
		{"running", []corev1.ContainerStatus{running()}, corev1.RestartPolicyAlways, false, corev1.PodRunning},
		{"backing off after a crash is still running", []corev1.ContainerStatus{backingOff()}, corev1.RestartPolicyAlways, false, corev1.PodRunning},
		{"exit 0 under Never", []corev1.ContainerStatus{exited(0)}, corev1.RestartPolicyNever, false, corev1.PodSucceeded},
		{"exit 1 under Never", []corev1.ContainerStatus{exited(1)}, corev1.RestartPolicyNever, false, corev1.PodFailed},
		{"one failed, one still running", []corev1.ContainerStatus{exited(1), running()}, corev1.RestartPolicyNever, false, corev1.PodRunning},
		{"exit 0 under Always, deleted", []corev1.ContainerStatus{exited(0)}, corev1.RestartPolicyAlways, true, corev1.PodSucceeded},
		{"killed under Always, deleted", []corev1.ContainerStatus{exited(143)}, corev1.RestartPolicyAlways, true, corev1.PodFailed},
	}
	for _, c := range cases {
		if got := podPhase(c.statuses, c.policy, c.deleting); got != c.want {
			t.Errorf("%s: phase %s, want %s", c.name, got, c.want)
		}
	}
}

func TestPodConditionsFollowReadinessAndKeepTransitionTimes(t *testing.T) {
	then := metav1.NewTime(time.Unix(1000, 0))
	now := metav1.NewTime(time.Unix(2000, 0))
	ready, notReady := running(), running()
	ready.Ready = true
	conditions := podConditions(nil, true, []corev1.ContainerStatus{ready, notReady}, then)
	byType := map[corev1.PodConditionType]corev1.PodCondition{}
	for _, c := range conditions {
		byType[c.Type] = c
	}
	if byType[corev1.PodReady].Status != corev1.ConditionFalse || byType[corev1.PodReady].Reason != "ContainersNotReady" {
		t.Errorf("one container not ready: Ready %+v", byType[corev1.PodReady])
	}
	if byType[corev1.PodReadyToStartContainers].Status != corev1.ConditionTrue || byType[corev1.PodScheduled].Status != corev1.ConditionTrue {
		t.Errorf("sandbox and scheduling: %+v", conditions)
	}
	notReady.Ready = true
	later := podConditions(conditions, true, []corev1.ContainerStatus{ready, notReady}, now)
	for _, c := range later {
		switch c.Type {
		case corev1.PodReady, corev1.ContainersReady:
			if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&now) {
				t.Errorf("%s turned True now: %+v", c.Type, c)
			}
		default:
			if !c.LastTransitionTime.Equal(&then) {
				t.Errorf("%s did not change but its transition time moved: %+v", c.Type, c)
			}
		}
	}
}

func TestRestarts(t *testing.T) {
	cases := []struct {
		policy corev1.RestartPolicy
		code   int
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 137, true},
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 2, true},
		{corev1.RestartPolicyNever, 2, false},
	}
	for _, c := range cases {
		if got := restarts(c.policy, c.code); got != c.want {
			t.Errorf("restarts(%s, %d) = %v", c.policy, c.code, got)
		}
	}
}

func TestExpandReferences(t *testing.T) {
	values := map[string]string{"POD_IP": "10.245.0.2", "PORT": "8000"}
	cases := map[string]string{
		"--host=$(POD_IP)":     "--host=10.245.0.2",
		"$(POD_IP):$(PORT)":    "10.245.0.2:8000",
		"$(UNDEFINED)":         "$(UNDEFINED)",
		"$$(POD_IP)":           "$(POD_IP)",
		"cost $5":              "cost $5",
		"trailing $":           "trailing $",
		"$(unterminated":       "$(unterminated",
		"$(PORT)$(PORT)$$$$":   "80008000$$",
		"no references at all": "no references at all",
	}
	for in, want := range cases {
		if got := expandReferences(in, values); got != want {
			t.Errorf("expandReferences(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestImageMapLookupAndArgv(t *testing.T) {
	images := imageMap{
		"ghcr.io/infernetes/infernetes": {Entrypoint: []string{"infernetes", "serve"}, Cmd: []string{"--help"}},
		"*":                             {Entrypoint: []string{"sh"}},
	}
	runtime, ok := images.lookup("ghcr.io/infernetes/infernetes:0.1.0")
	if !ok || runtime.Entrypoint[0] != "infernetes" {
		t.Fatalf("the tag is ignored: %+v", runtime)
	}
	if other, _ := images.lookup("localhost:5000/other@sha256:abc"); other.Entrypoint[0] != "sh" {
		t.Errorf("anything else is *: %+v", other)
	}
	checks := []struct {
		command, args, want []string
	}{
		{nil, nil, []string{"infernetes", "serve", "--help"}},
		{nil, []string{"--model=m"}, []string{"infernetes", "serve", "--model=m"}},
		{[]string{"python"}, nil, []string{"python"}},
		{[]string{"python"}, []string{"-V"}, []string{"python", "-V"}},
	}
	for _, c := range checks {
		if got := runtime.argv(c.command, c.args); !reflect.DeepEqual(got, c.want) {
			t.Errorf("argv(%v, %v) = %v, want %v", c.command, c.args, got, c.want)
		}
	}
}

func TestCredentials(t *testing.T) {
	uid, gid, fsGroup, other := int64(1001), int64(1002), int64(1003), int64(2000)
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{
		RunAsUser: &uid, RunAsGroup: &gid, FSGroup: &fsGroup, SupplementalGroups: []int64{7},
	}}}
	c := &corev1.Container{}
	want := &credentials{UID: 1001, GID: 1002, Groups: []uint32{1003, 7}}
	if got := credentialsFor(pod, c); !reflect.DeepEqual(got, want) {
		t.Errorf("pod-level user: %+v", got)
	}
	c.SecurityContext = &corev1.SecurityContext{RunAsUser: &other}
	if got := credentialsFor(pod, c); got.UID != 2000 || got.GID != 1002 {
		t.Errorf("the container's runAsUser wins: %+v", got)
	}
	if got := credentialsFor(&corev1.Pod{}, &corev1.Container{}); got != nil {
		t.Errorf("no user asked for: %+v", got)
	}
}

func TestKeptDirectoriesAreBoundAgainOnlyUnderAVolume(t *testing.T) {
	mounts := []bindMount{{Source: "/var/lib/pods/x/tmp", Target: "/tmp"}, {Source: "/m", Target: "/mnt/models/"}}
	got := keptMounts([]string{"/tmp/ci-clone/.venv", "/root/.pyenv", "/tmp", "/mnt/models/x"}, mounts)
	want := []bindMount{
		{Source: "/tmp/ci-clone/.venv", Target: "/tmp/ci-clone/.venv", ReadOnly: true},
		{Source: "/mnt/models/x", Target: "/mnt/models/x", ReadOnly: true},
	}
	if len(got) != len(want) {
		t.Fatalf("keptMounts = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("keptMounts[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}
