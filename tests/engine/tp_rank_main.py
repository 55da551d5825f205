"""One rank of a tensor-parallel run, for test_engine_tensor_parallel.py: joins a gloo group
(``torch.distributed``'s env:// rendezvous: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), runs the
engine on its shard of the model and prints each request's greedy tokens and logprobs as JSON.

Run as a script: ``python tp_rank_main.py '{"model": ..., "prompts": [[...]], ...}'``.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main(spec: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from infernetes.runtime.engine.llm_engine import LLMEngine
    from infernetes.runtime.sampling_params import SamplingParams

    from infernetes.schema.config import build_config

    counts = {"preemptions": 0, "prefix_hits": 0}

    class Counter:
        def record(self, scheduler_stats, iteration_stats) -> None:
            counts["preemptions"] += scheduler_stats.num_preemptions
            counts["prefix_hits"] += scheduler_stats.prefix_cache_stats.hits

    config = build_config(spec["model"], device="cpu", **spec["engine"])
    engine = LLMEngine(config, stat_loggers=[Counter()])
    params = SamplingParams(
        temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True, logprobs=1
    )
    for i, prompt in enumerate(spec["prompts"]):
        engine.add_request(str(i), prompt, params)
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                completion = output.outputs[0]
                logprobs = [
                    entry[t].logprob
                    for t, entry in zip(completion.token_ids, completion.logprobs, strict=True)
                ]
                results[output.request_id] = {"tokens": completion.token_ids, "logprobs": logprobs}
    layer = engine.engine_core.executor.driver_worker.model_runner.attention_layers[0]
    heads = [layer.num_heads, layer.num_kv_heads]
    print(json.dumps({"results": results, "heads": heads, **counts}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
