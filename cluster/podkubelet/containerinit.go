package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// launchSpec is what the kubelet hands to `podkubelet container-init`, which runs inside the pod's
// network namespace (through `ip netns exec`, which also gives it a mount namespace of its own):
// it bind-mounts the volumes, becomes the pod's user and execs the container's command, so the
// container process is the one the kubelet started and waits for.
type launchSpec struct {
	Argv       []string     `json:"argv"`
	Env        []string     `json:"env"`
	WorkingDir string       `json:"workingDir,omitempty"`
	Mounts     []bindMount  `json:"mounts,omitempty"`
	User       *credentials `json:"user,omitempty"`
}

type bindMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

type credentials struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// containerInit never returns on success (it execs the container's command).
func containerInit(specPath string) error {
	data, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec launchSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	// Nothing mounted here may reach the host's mount table.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private in the pod's mount namespace: %w", err)
	}
	// Parents before children: /a is mounted before /a/b.
	sort.SliceStable(spec.Mounts, func(i, j int) bool {
		return len(spec.Mounts[i].Target) < len(spec.Mounts[j].Target)
	})
	// Every source is opened before anything is mounted: a mount (an emptyDir on /tmp, say) must
	// not hide the source of a later one (a model directory under the host's /tmp).
	sources := make([]*os.File, len(spec.Mounts))
	for i, m := range spec.Mounts {
		f, err := os.OpenFile(m.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("volume source %s: %w", m.Source, err)
		}
		sources[i] = f
	}
	for i, m := range spec.Mounts {
		if err := bind(m, sources[i]); err != nil {
			return err
		}
		_ = sources[i].Close()
	}
	for _, kv := range spec.Env {
		if key, _, ok := strings.Cut(kv, "="); ok && key == "PATH" {
			// exec.LookPath reads PATH from this process's environment.
			_ = os.Setenv("PATH", kv[len("PATH="):])
		}
	}
	path, err := exec.LookPath(spec.Argv[0])
	if err != nil {
		return fmt.Errorf("executable %q not found in the container's PATH: %w", spec.Argv[0], err)
	}
	// A container starts in its workingDir, else its image's, else / (never the kubelet's).
	workingDir := spec.WorkingDir
	if workingDir == "" {
		workingDir = "/"
	}
	if err := os.Chdir(workingDir); err != nil {
		return fmt.Errorf("workingDir: %w", err)
	}
	if u := spec.User; u != nil {
		groups := make([]int, 0, len(u.Groups))
		for _, g := range u.Groups {
			groups = append(groups, int(g))
		}
		if err := syscall.Setgroups(groups); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setgid(int(u.GID)); err != nil {
			return fmt.Errorf("setgid %d: %w", u.GID, err)
		}
		if err := syscall.Setuid(int(u.UID)); err != nil {
			return fmt.Errorf("setuid %d: %w", u.UID, err)
		}
	}
	return syscall.Exec(path, spec.Argv, spec.Env)
}

func bind(m bindMount, source *os.File) error {
	info, err := source.Stat()
	if err != nil {
		return fmt.Errorf("volume source %s: %w", m.Source, err)
	}
	// The mount point must exist; with no root filesystem of its own the pod shares the host's,
	// so a missing one is created there (empty; the mount hides it only inside the pod).
	if info.IsDir() {
		err = os.MkdirAll(m.Target, 0o755)
	} else if _, statErr := os.Stat(m.Target); os.IsNotExist(statErr) {
		if err = os.MkdirAll(dirOf(m.Target), 0o755); err == nil {
			var f *os.File
			if f, err = os.Create(m.Target); err == nil {
				err = f.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("mount point %s: %w", m.Target, err)
	}
	// The descriptor's /proc path names the source as it was opened.
	fdPath := fmt.Sprintf("/proc/self/fd/%d", source.Fd())
	if err := syscall.Mount(fdPath, m.Target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		if err := syscall.Mount("", m.Target, "", flags, ""); err != nil {
			return fmt.Errorf("remounting %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

func dirOf(path string) string {
	if i := strings.LastIndex(path, "/"); i > 0 {
		return path[:i]
	}
	return "/"
}
