"""The tensor-parallel layers for real: each rank a process of its own in a gloo group, holding
its shard of a tiny model of every supported architecture (attention heads split, KV heads split
or replicated, vocabulary-parallel embedding and LM head, row-parallel all-reduce), must produce
transformers' greedy tokens, and every rank the same ones. The executor that starts the ranks is the parallelism issue's; here the
test starts them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RANK_MAIN = Path(__file__).with_name("tp_rank_main.py")
LONG = [1, 5, 9, 200, 17, 3, 44, 8, 91, 12, 7, 300, 5, 5, 60, 2, 33]
PROMPTS = [LONG, [1, 77, 4, 150, 6], [*LONG[:16], 9, 9]]  # the third shares two blocks
MAX_TOKENS = 12


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_ranks(model: str, world_size: int, engine: dict) -> list[dict]:
    spec = json.dumps(
        {"model": model, "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "engine": engine}
    )
    port = _free_port()
    ranks = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        ranks.append(
            subprocess.Popen(
                [sys.executable, str(RANK_MAIN), spec],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    for process in ranks:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs


ENGINE = {
    "dtype": "float32",
    "max_model_len": 40,
    "block_size": 8,
    # a small token budget chunks the prefills; 5 blocks for 3 requests of up to 4 preempt
    "num_gpu_blocks_override": 5,
    "max_num_batched_tokens": 8,
    "enable_prefix_caching": True,
}


@pytest.mark.slow  # two processes per case, about ten seconds each
@pytest.mark.parametrize(
    ("architecture", "overrides", "heads_per_rank"),
    [
        ("LlamaForCausalLM", {}, [2, 1]),  # 4 query heads, 2 KV heads: one each
        ("LlamaForCausalLM", {"num_key_value_heads": 1}, [2, 1]),  # 1 KV head, replicated
        ("MistralForCausalLM", {}, [2, 1]),
        ("Qwen2ForCausalLM", {}, [2, 1]),
        ("Qwen3ForCausalLM", {}, [2, 1]),
        ("OPTForCausalLM", {}, [2, 2]),
        ("GPT2LMHeadModel", {}, [2, 2]),
    ],
)
def test_tensor_parallel_ranks_match_transformers(
    model_factory, hf_greedy, architecture, overrides, heads_per_rank
):
    model = model_factory(architecture, **overrides)
    ranks = _run_ranks(model, 2, ENGINE)
    assert ranks[0]["preemptions"] > 0 and ranks[0]["prefix_hits"] > 0
    for rank in ranks:
        assert rank["heads"] == heads_per_rank
        assert rank["results"] == ranks[0]["results"]  # every rank samples the same tokens
    for i, prompt in enumerate(PROMPTS):
        assert ranks[0]["results"][str(i)]["tokens"] == hf_greedy(model, prompt, MAX_TOKENS)
