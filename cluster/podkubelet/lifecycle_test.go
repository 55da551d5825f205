package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func withPreStop(hook *corev1.LifecycleHandler) *corev1.Container {
	return &corev1.Container{
		Name:      "server",
		Ports:     []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}},
		Lifecycle: &corev1.Lifecycle{PreStop: hook},
	}
}

func TestCheckLifecycleTakesSleepAndHTTPGetAndRefusesTheRest(t *testing.T) {
	accepted := []*corev1.LifecycleHandler{
		{Sleep: &corev1.SleepAction{Seconds: 5}},
		{HTTPGet: &corev1.HTTPGetAction{Path: "/drain", Port: intstr.FromString("http")}},
	}
	for _, hook := range accepted {
		if err := checkLifecycle(withPreStop(hook)); err != nil {
			t.Errorf("%+v: %v", hook, err)
		}
	}
	refused := map[string]*corev1.Container{
		"not exec":          withPreStop(&corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}),
		"not a named port":  withPreStop(&corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("admin")}}),
		"no postStart hook": {Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 1}}}},
	}
	for want, c := range refused {
		if err := checkLifecycle(c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error saying %q, got %v", want, err)
		}
	}
}

func TestRunPreStopCallsTheHTTPGetHookOnThePodIP(t *testing.T) {
	var calls atomic.Int32
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/drain" {
			calls.Add(1)
		}
	}))
	defer server.Close()
	host, port, _ := net.SplitHostPort(server.Listener.Addr().String())
	number, _ := strconv.Atoi(port)
	c := withPreStop(&corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/drain", Port: intstr.FromInt(number)}})
	left, err := runPreStop(c, host, time.Minute)
	if err != nil || calls.Load() != 1 {
		t.Fatalf("err %v, calls %d", err, calls.Load())
	}
	if left > time.Minute || left < minimumGraceAfterHook {
		t.Errorf("grace left %v", left)
	}
}

func TestRunPreStopLeavesTheKubeletsMinimumWhenTheHookOutlastsTheGrace(t *testing.T) {
	c := withPreStop(&corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 60}})
	left, err := runPreStop(c, "", 0)
	if err != nil || left != minimumGraceAfterHook {
		t.Fatalf("left %v, err %v", left, err)
	}
	if left, _ := runPreStop(&corev1.Container{}, "", time.Minute); left != time.Minute {
		t.Errorf("no hook: the whole grace period, got %v", left)
	}
}
