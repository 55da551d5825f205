package main

import (
	"fmt"
	"math"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// podFacts are the values the downward API exposes that only the kubelet knows.
type podFacts struct {
	podIP  string
	hostIP string
}

// fieldValue resolves a downward-API fieldRef (the paths the API server accepts for env).
func fieldValue(pod *corev1.Pod, facts podFacts, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return facts.podIP, nil
	case "status.hostIP", "status.hostIPs":
		return facts.hostIP, nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	}
	for prefix, values := range map[string]map[string]string{
		"metadata.labels['":      pod.Labels,
		"metadata.annotations['": pod.Annotations,
	} {
		if key, ok := strings.CutPrefix(path, prefix); ok && strings.HasSuffix(key, "']") {
			return values[strings.TrimSuffix(key, "']")], nil
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

func formatMap(m map[string]string) string {
	lines := make([]string, 0, len(m))
	for k, v := range m {
		lines = append(lines, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// resourceValue resolves a resourceFieldRef as the kubelet does: the quantity divided by the
// divisor, rounded up; a missing limit falls back to the node's allocatable.
func resourceValue(c *corev1.Container, node *corev1.Node, ref *corev1.ResourceFieldSelector) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	var q resource.Quantity
	var found bool
	switch kind {
	case "limits":
		q, found = c.Resources.Limits[corev1.ResourceName(name)]
		if !found {
			q, found = node.Status.Allocatable[corev1.ResourceName(name)]
		}
	case "requests":
		q, found = c.Resources.Requests[corev1.ResourceName(name)]
	default:
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	if !found {
		return "0", nil
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	return fmt.Sprint(int64(math.Ceil(q.AsApproximateFloat64() / divisor.AsApproximateFloat64()))), nil
}

type objectSource struct {
	configMaps corev1listers.ConfigMapLister
	secrets    corev1listers.SecretLister
}

func (s objectSource) configMap(ns, name string) (map[string]string, error) {
	cm, err := s.configMaps.ConfigMaps(ns).Get(name)
	if err != nil {
		return nil, err
	}
	data := map[string]string{}
	for k, v := range cm.BinaryData {
		data[k] = string(v)
	}
	for k, v := range cm.Data {
		data[k] = v
	}
	return data, nil
}

func (s objectSource) secret(ns, name string) (map[string]string, error) {
	secret, err := s.secrets.Secrets(ns).Get(name)
	if err != nil {
		return nil, err
	}
	data := map[string]string{}
	for k, v := range secret.Data {
		data[k] = string(v)
	}
	for k, v := range secret.StringData {
		data[k] = v
	}
	return data, nil
}

// containerEnv builds the container's environment: the image's, then envFrom, then env (later
// wins), with $(VAR) references to earlier entries expanded as the kubelet does.
func containerEnv(pod *corev1.Pod, c *corev1.Container, node *corev1.Node, facts podFacts, image imageConfig, objects objectSource) ([]string, map[string]string, error) {
	values := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, seen := values[k]; !seen {
			order = append(order, k)
		}
		values[k] = v
	}
	for _, k := range sortedKeys(image.Env) {
		set(k, image.Env[k])
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		var err error
		optional := false
		switch {
		case from.ConfigMapRef != nil:
			optional = from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional
			data, err = objects.configMap(pod.Namespace, from.ConfigMapRef.Name)
		case from.SecretRef != nil:
			optional = from.SecretRef.Optional != nil && *from.SecretRef.Optional
			data, err = objects.secret(pod.Namespace, from.SecretRef.Name)
		}
		if err != nil {
			if optional {
				continue
			}
			return nil, nil, fmt.Errorf("envFrom: %w", err)
		}
		for _, k := range sortedKeys(data) {
			set(from.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		value, err := envValue(pod, c, node, facts, objects, e, values)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		set(e.Name, value)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+values[k])
	}
	return env, values, nil
}

func envValue(pod *corev1.Pod, c *corev1.Container, node *corev1.Node, facts podFacts, objects objectSource, e corev1.EnvVar, earlier map[string]string) (string, error) {
	from := e.ValueFrom
	if from == nil {
		return expandReferences(e.Value, earlier), nil
	}
	switch {
	case from.FieldRef != nil:
		return fieldValue(pod, facts, from.FieldRef.FieldPath)
	case from.ResourceFieldRef != nil:
		return resourceValue(c, node, from.ResourceFieldRef)
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		return keyOf(objects.configMap(pod.Namespace, ref.Name))(ref.Key, ref.Optional)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		return keyOf(objects.secret(pod.Namespace, ref.Name))(ref.Key, ref.Optional)
	}
	return "", fmt.Errorf("valueFrom has no source podkubelet supports")
}

func keyOf(data map[string]string, err error) func(string, *bool) (string, error) {
	return func(key string, optional *bool) (string, error) {
		if value, ok := data[key]; ok && err == nil {
			return value, nil
		}
		if optional != nil && *optional {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		return "", fmt.Errorf("key %q not found", key)
	}
}

// expandReferences replaces $(NAME) with a defined variable's value and $$ with $; undefined
// references stay as written (the kubelet's rule).
func expandReferences(s string, values map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if end := strings.IndexByte(s[i+2:], ')'); end >= 0 {
				name := s[i+2 : i+2+end]
				if value, ok := values[name]; ok {
					b.WriteString(value)
					i += 2 + end
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
