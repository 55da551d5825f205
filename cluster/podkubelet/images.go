package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// imageConfig is the part of an image's configuration a process needs: there are no images
// here, so a file maps each image to the command and environment its container would have.
type imageConfig struct {
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	WorkingDir string            `json:"workingDir,omitempty"`
	// Keep: host directories that stand for the image's own files (its interpreter and code).
	// With no root filesystem of its own a pod shares the host's, so a volume mounted above one
	// (an emptyDir on /tmp while the code lives under /tmp) would hide it: each is bound again
	// on itself, above the volumes.
	Keep []string `json:"keep,omitempty"`
}

// imageMap is keyed by image reference: exact, then without the digest, then without the tag,
// then "*" (any image).
type imageMap map[string]imageConfig

func loadImageMap(path string) (imageMap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var images imageMap
	if err := json.Unmarshal(data, &images); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return images, nil
}

func (m imageMap) lookup(image string) (imageConfig, bool) {
	candidates := []string{image}
	name, _, _ := strings.Cut(image, "@")
	candidates = append(candidates, name)
	if slash, colon := strings.LastIndex(name, "/"), strings.LastIndex(name, ":"); colon > slash {
		candidates = append(candidates, name[:colon])
	}
	candidates = append(candidates, "*")
	for _, key := range candidates {
		if config, ok := m[key]; ok {
			return config, true
		}
	}
	return imageConfig{}, false
}

// argv is what a container runs: command replaces the entrypoint, args replace the image's cmd
// (and, when only command is given, the image's cmd is dropped), as Kubernetes defines them.
func (c imageConfig) argv(command, args []string) []string {
	switch {
	case len(command) > 0:
		return append(append([]string{}, command...), args...)
	case len(args) > 0:
		return append(append([]string{}, c.Entrypoint...), args...)
	default:
		return append(append([]string{}, c.Entrypoint...), c.Cmd...)
	}
}
