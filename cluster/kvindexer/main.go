// kvindexer runs llm-d's KV-cache indexer (its kvevents pool and ZMQ subscriber, its kvblock
// in-memory index and token processor, from github.com/llm-d/llm-d-kv-cache-manager) on its own,
// for a test to feed it a real server's KV events and ask which pod holds a prompt's prefix.
// It is test tooling, kept apart from the product; the decoding and indexing are llm-d's.
//
//	kvindexer -endpoint tcp://127.0.0.1:5557 [-block-size 16] [-hash-seed ""]
//
// The SUB socket binds the endpoint (llm-d's subscriber does): servers publish to it with a
// connecting endpoint and the topic kv@<pod>@<model>. Queries are JSON lines on stdin, answers
// JSON lines on stdout (the first line says it is ready):
//
//	{"op": "lookup", "model": M, "tokens": [...]}  -> {"blocks": n, "prefix_blocks": k, "pods": [...]}
//	{"op": "stats"}                                 -> counts of what llm-d's pool decoded
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/llm-d/llm-d-kv-cache-manager/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache-manager/pkg/kvcache/kvevents"
)

type request struct {
	Op     string   `json:"op"`
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
}

func main() {
	endpoint := flag.String("endpoint", "tcp://127.0.0.1:5557", "ZMQ endpoint the SUB socket binds")
	blockSize := flag.Int("block-size", 16, "tokens per block (the engines' --block-size)")
	hashSeed := flag.String("hash-seed", "", "the engines' PYTHONHASHSEED")
	flag.Parse()

	st := newStats()
	// llm-d's pool reports what it decoded and what it could not only through its logger, at
	// V(DEBUG).V(TRACE) for a batch (logr adds the levels: 9).
	log.SetLogger(funcr.NewJSON(st.observe, funcr.Options{Verbosity: 9}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	inner, err := kvblock.NewIndex(ctx, kvblock.DefaultIndexConfig())
	if err != nil {
		fail(err)
	}
	index := &countingIndex{Index: inner, stats: st}
	cfg := kvevents.DefaultConfig()
	cfg.ZMQEndpoint = *endpoint
	cfg.Concurrency = 1
	pool := kvevents.NewPool(cfg, index)
	pool.Start(ctx)

	tokens := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{
		BlockSize: *blockSize, HashSeed: *hashSeed,
	})
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"ready": true, "endpoint": *endpoint})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			_ = out.Encode(map[string]any{"error": err.Error()})
			continue
		}
		switch req.Op {
		case "lookup":
			_ = out.Encode(lookup(ctx, index, tokens.TokensToKVBlockKeys(req.Tokens, req.Model)))
		case "stats":
			_ = out.Encode(st.snapshot())
		default:
			_ = out.Encode(map[string]any{"error": "unknown op " + req.Op})
		}
	}
	pool.Shutdown(ctx)
}

// lookup names the pods holding the longest run of the prompt's blocks from its first, as llm-d's
// longest-prefix scorer counts them.
func lookup(ctx context.Context, index kvblock.Index, keys []kvblock.Key) map[string]any {
	answer := map[string]any{"blocks": len(keys), "prefix_blocks": 0, "pods": []string{}}
	if len(keys) == 0 {
		return answer
	}
	found, err := index.Lookup(ctx, keys, sets.New[string]())
	if err != nil {
		answer["error"] = err.Error()
		return answer
	}
	var holders sets.Set[string]
	for i, key := range keys {
		here := sets.New[string]()
		for _, entry := range found[key] {
			here.Insert(entry.PodIdentifier)
		}
		if i > 0 {
			here = here.Intersection(holders)
		}
		if here.Len() == 0 {
			break
		}
		holders = here
		answer["prefix_blocks"] = i + 1
	}
	if holders != nil {
		pods := holders.UnsortedList()
		sort.Strings(pods)
		answer["pods"] = pods
	}
	return answer
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kvindexer:", err)
	os.Exit(1)
}
