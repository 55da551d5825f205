"""Decode steps on the CPU replay their recorded C kernel calls (kernels/cpu/replay.py through
cuda_graph.CpuKernelBackend): the tokens equal an eager engine's, each batch size is recorded at
its first decode step, and --enforce-eager or a forward that reads values on the host keeps
decode eager."""

from __future__ import annotations

import logging

import pytest
from gguf import GGMLQuantizationType as Q
from infernetes.kernels.cpu import replay
from infernetes.runtime.llm import LLM
from infernetes.runtime.model_executor import cuda_graph
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing_gguf import write_gguf
from transformers import AutoConfig

pytestmark = pytest.mark.skipif(replay.library() is None, reason="no C compiler")

PROMPTS = [[1, 5, 9, 23, 77], [1, 300, 2, 41], [1, 17, 17, 17, 101, 250, 3]]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def graphs(llm: LLM) -> cuda_graph.DecodeGraphs | None:
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs


def tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def q4_file(model_factory, tmp_path_factory):
    model = model_factory("LlamaForCausalLM", tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("gguf")
    return str(write_gguf(model, folder / "tiny-Q4_1.gguf", Q.Q4_1)), model


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_replayed_decode_equals_eager_on_gguf_blocks(q4_file, dtype):
    file, tokenizer = q4_file
    settings = dict(tokenizer=tokenizer, dtype=dtype, max_model_len=128, max_num_seqs=4)
    eager = LLM(file, enforce_eager=True, **settings)
    assert graphs(eager) is None
    replayed = LLM(file, **settings)
    want = tokens(eager)
    assert tokens(replayed) == want
    assert tokens(replayed, PROMPTS[:1]) == want[:1]  # another size: recorded at its first step
    decode = graphs(replayed)
    assert decode is not None and decode.backend.name == "cpu"
    assert decode.replays[4] >= 7 and decode.replays[1] >= 7  # 3 sequences padded to 4
    layers = AutoConfig.from_pretrained(tokenizer).num_hidden_layers
    for size in (1, 4):
        program = decode._replays[size]
        assert isinstance(program, replay.Program), program
        # the embedding's lookup in torch, then the layers' kernels in C: one run at batch 1,
        # two a layer above (the value rows copied out of the fused QKV output in between)
        assert program.kernel_runs <= (1 if size == 1 else layers + 1), program.steps


def test_replayed_decode_equals_eager_on_dense_weights(tiny_llama):
    settings = dict(dtype="float32", max_model_len=128, max_num_seqs=16)
    prompts = PROMPTS * 4  # 12 sequences: past the replay's largest batch, eager
    eager = LLM(tiny_llama, enforce_eager=True, **settings)
    replayed = LLM(tiny_llama, **settings)
    assert tokens(replayed) == tokens(eager)
    assert isinstance(graphs(replayed)._replays[4], replay.Program)
    assert tokens(replayed, prompts) == tokens(eager, prompts)
    assert max(graphs(replayed).replays) <= cuda_graph.CpuKernelBackend.max_batch


def test_a_forward_with_host_reads_decodes_eagerly_with_the_reason(tiny_llama, caplog):
    # an fp8 KV cache: its decode attention reads the scales on the host (float(k_scale))
    settings = dict(dtype="float32", max_model_len=128, max_num_seqs=4, kv_cache_dtype="fp8")
    want = tokens(LLM(tiny_llama, enforce_eager=True, **settings))
    with caplog.at_level(logging.INFO, logger=cuda_graph.__name__):
        replayed = LLM(tiny_llama, **settings)
        assert tokens(replayed) == want
    assert "CPU kernel replay is refused" in caplog.text
    assert not isinstance(graphs(replayed)._replays[4], replay.Program)
