package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/llm-d/llm-d-kv-cache-manager/pkg/kvcache/kvblock"
)

// stats counts what llm-d's pool did, read from its log lines (it has no other report) and from
// the calls it makes on the index.
type stats struct {
	mu          sync.Mutex
	batches     int      // batches the pool decoded ("Digesting events")
	events      int      // events in them that decoded
	errors      []string // the pool's decoding failures, as it logs them
	storedKeys  int      // keys the pool added to the index (from BlockStored)
	evictedKeys int      // keys the pool evicted (from BlockRemoved)
}

func newStats() *stats { return &stats{errors: []string{}} }

// observe takes one of the pool's JSON log lines.
func (s *stats) observe(line string) {
	fmt.Fprintln(os.Stderr, line)
	var entry map[string]any
	if json.Unmarshal([]byte(line), &entry) != nil {
		return
	}
	msg, _ := entry["msg"].(string)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case msg == "Digesting events":
		count, _ := entry["count"].(float64)
		s.batches++
		s.events += int(count)
	case strings.HasPrefix(msg, "Failed") || strings.HasPrefix(msg, "Malformed") ||
		strings.HasPrefix(msg, "Unknown event"):
		s.errors = append(s.errors, line)
	}
}

func (s *stats) snapshot() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string]any{
		"batches": s.batches, "events": s.events, "errors": append([]string{}, s.errors...),
		"stored_keys": s.storedKeys, "evicted_keys": s.evictedKeys,
	}
}

// countingIndex is llm-d's index, counting the keys the pool adds and evicts.
type countingIndex struct {
	kvblock.Index
	stats *stats
}

func (c *countingIndex) Add(ctx context.Context, keys []kvblock.Key, entries []kvblock.PodEntry) error {
	c.stats.mu.Lock()
	c.stats.storedKeys += len(keys)
	c.stats.mu.Unlock()
	return c.Index.Add(ctx, keys, entries)
}

func (c *countingIndex) Evict(ctx context.Context, key kvblock.Key, entries []kvblock.PodEntry) error {
	c.stats.mu.Lock()
	c.stats.evictedKeys++
	c.stats.mu.Unlock()
	return c.Index.Evict(ctx, key, entries)
}
