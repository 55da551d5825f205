package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// volumePreparer turns a pod's volumes into host directories the container-init bind-mounts.
type volumePreparer struct {
	client  kubernetes.Interface
	objects objectSource
}

// prepare returns each volume's host path; the files of configMap, secret and projected volumes
// are written once, at pod start (the kubelet would refresh them; these do not change).
func (v volumePreparer) prepare(ctx context.Context, pod *corev1.Pod, facts podFacts, podDir string) (map[string]string, error) {
	paths := map[string]string{}
	for _, vol := range pod.Spec.Volumes {
		dir := filepath.Join(podDir, "volumes", vol.Name)
		var err error
		switch {
		case vol.EmptyDir != nil:
			// Medium Memory is a directory too (no tmpfs): the size limit is not enforced.
			err = makeWorldWritable(dir)
		case vol.HostPath != nil:
			dir, err = hostPathSource(vol.HostPath)
		case vol.ConfigMap != nil:
			err = v.writeKeys(dir, pod.Namespace, vol.ConfigMap.Name, vol.ConfigMap.Items, vol.ConfigMap.Optional, v.objects.configMap)
		case vol.Secret != nil:
			err = v.writeKeys(dir, pod.Namespace, vol.Secret.SecretName, vol.Secret.Items, vol.Secret.Optional, v.objects.secret)
		case vol.Projected != nil:
			err = v.writeProjected(ctx, pod, facts, dir, vol.Projected)
		case vol.PersistentVolumeClaim != nil:
			dir, err = v.claimSource(ctx, pod.Namespace, vol.PersistentVolumeClaim.ClaimName)
		default:
			err = fmt.Errorf("podkubelet supports emptyDir, hostPath, configMap, secret, projected and persistentVolumeClaim (of a hostPath or local volume) volumes")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %q: %w", vol.Name, err)
		}
		paths[vol.Name] = dir
	}
	return paths, nil
}

func makeWorldWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	// As the kubelet's emptyDir: writable by whichever user the container runs as.
	return os.Chmod(dir, 0o777)
}

func hostPathSource(h *corev1.HostPathVolumeSource) (string, error) {
	kind := corev1.HostPathUnset
	if h.Type != nil {
		kind = *h.Type
	}
	info, err := os.Stat(h.Path)
	switch kind {
	case corev1.HostPathUnset:
		return h.Path, nil
	case corev1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return h.Path, os.MkdirAll(h.Path, 0o755)
		}
	case corev1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Dir(h.Path), 0o755); err != nil {
				return "", err
			}
			return h.Path, os.WriteFile(h.Path, nil, 0o644)
		}
	}
	if err != nil {
		return "", fmt.Errorf("hostPath %s: %w", h.Path, err)
	}
	switch kind {
	case corev1.HostPathDirectory, corev1.HostPathDirectoryOrCreate:
		if !info.IsDir() {
			return "", fmt.Errorf("hostPath %s is not a directory", h.Path)
		}
	case corev1.HostPathFile, corev1.HostPathFileOrCreate:
		if !info.Mode().IsRegular() {
			return "", fmt.Errorf("hostPath %s is not a file", h.Path)
		}
	case corev1.HostPathSocket, corev1.HostPathCharDev, corev1.HostPathBlockDev:
		// Exists, which is all this kubelet checks for these types.
	}
	return h.Path, nil
}

func (v volumePreparer) writeKeys(dir, ns, name string, items []corev1.KeyToPath, optional *bool, get func(string, string) (map[string]string, error)) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := get(ns, name)
	if err != nil {
		if optional != nil && *optional {
			return nil
		}
		return err
	}
	if len(items) == 0 {
		for key, value := range data {
			if err := writeFile(dir, key, value); err != nil {
				return err
			}
		}
		return nil
	}
	for _, item := range items {
		value, ok := data[item.Key]
		if !ok {
			if optional != nil && *optional {
				continue
			}
			return fmt.Errorf("%s/%s has no key %q", ns, name, item.Key)
		}
		if err := writeFile(dir, item.Path, value); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(dir, rel, value string) error {
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(value), 0o644)
}

func (v volumePreparer) writeProjected(ctx context.Context, pod *corev1.Pod, facts podFacts, dir string, p *corev1.ProjectedVolumeSource) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, source := range p.Sources {
		var err error
		switch {
		case source.ServiceAccountToken != nil:
			err = v.writeToken(ctx, pod, dir, source.ServiceAccountToken)
		case source.ConfigMap != nil:
			err = v.writeKeys(dir, pod.Namespace, source.ConfigMap.Name, source.ConfigMap.Items, source.ConfigMap.Optional, v.objects.configMap)
		case source.Secret != nil:
			err = v.writeKeys(dir, pod.Namespace, source.Secret.Name, source.Secret.Items, source.Secret.Optional, v.objects.secret)
		case source.DownwardAPI != nil:
			for _, item := range source.DownwardAPI.Items {
				if item.FieldRef == nil {
					return fmt.Errorf("downwardAPI item %q: only fieldRef is supported", item.Path)
				}
				value, ferr := fieldValue(pod, facts, item.FieldRef.FieldPath)
				if ferr != nil {
					return ferr
				}
				if err = writeFile(dir, item.Path, value); err != nil {
					return err
				}
			}
		default:
			err = fmt.Errorf("projected sources: podkubelet supports serviceAccountToken, configMap, secret and downwardAPI")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeToken asks the API server for a token bound to the pod (issued once: it is not refreshed).
func (v volumePreparer) writeToken(ctx context.Context, pod *corev1.Pod, dir string, t *corev1.ServiceAccountTokenProjection) error {
	request := &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: t.ExpirationSeconds,
			BoundObjectRef: &authenticationv1.BoundObjectReference{
				Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
			},
		},
	}
	if t.Audience != "" {
		request.Spec.Audiences = []string{t.Audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	token, err := v.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, request, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service account token for %s: %w", sa, err)
	}
	return writeFile(dir, t.Path, token.Status.Token)
}

// claimSource is the directory behind a bound claim: its PersistentVolume must be a hostPath or
// local volume (the only kinds a node of processes can attach).
func (v volumePreparer) claimSource(ctx context.Context, namespace, claim string) (string, error) {
	pvc, err := v.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return "", fmt.Errorf("claim %s is not bound", claim)
	}
	pv, err := v.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	switch {
	case pv.Spec.HostPath != nil:
		return hostPathSource(pv.Spec.HostPath)
	case pv.Spec.Local != nil:
		return pv.Spec.Local.Path, nil
	}
	return "", fmt.Errorf("claim %s: volume %s is neither hostPath nor local", claim, pv.Name)
}
