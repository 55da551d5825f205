"""Decode graphs on the Triton kernels (interpreted on a CPU): the engine replays padded decode
batches over the static buffers (``RerunBackend``: the forward re-run on them, everything of a CUDA
graph but the recording) and generates exactly what transformers does, as the eager engine does.
This is the kernel path a real CUDA graph captures: split-K decode over the static block-table
width, padding rows with slot -1 and seq_len 0."""

import functools

import pytest
import torch
from infernetes.kernels import backend
from infernetes.kernels.cpu import native
from infernetes.runtime.model_executor import cuda_graph
from infernetes.runtime.testing import make_tiny_llama
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from infernetes import LLM, SamplingParams

pytest.importorskip("triton")  # no Triton wheels outside Linux

PROMPTS = [[5, 7, 9], [11, 12, 13, 14, 15, 16], [20, 21], [30, 31, 32, 33, 34]]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (2, 4, 6, 8)]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny-llama-graphs")))


@pytest.fixture
def triton_graphs(monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    # the engine runs on the GPU where there is one (compiled kernels), else interpreted on the CPU
    assert (
        backend.attention_backend("cuda" if torch.cuda.is_available() else "cpu")
        == backend.TRITON_ATTN
    )
    monkeypatch.setattr(
        cuda_graph, "select_graph_backend", lambda device: cuda_graph.RerunBackend()
    )


@functools.cache
def _hf_greedy(path: str, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def test_triton_graph_replay_matches_transformers(tiny_llama, triton_graphs):
    from infernetes.kernels.triton_backend.attention import num_decode_splits

    # block_size 8 and --max-seq-len-to-capture 512: a static table 64 blocks wide, while the
    # eager tables of these sequences are 1-2 blocks wide; the small graphs split K
    llm = LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=512,
        num_gpu_blocks_override=64,
        block_size=8,
        max_num_seqs=4,
        cuda_graph_sizes=[1, 2, 4],
        max_seq_len_to_capture=512,
    )
    kv_heads = llm.llm_engine.engine_core.executor.driver_worker.model_runner.attention_layers[
        0
    ].num_kv_heads
    assert num_decode_splits(1, kv_heads, 512, torch.device("cpu")) > 1
    assert num_decode_splits(1, kv_heads, 16, torch.device("cpu")) == 1  # eager: no split
    outputs = llm.generate(PROMPTS, PARAMS)
    graphs = llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs
    assert graphs.block_tables.shape == (4, 64)
    # decode steps of 4, 3, 2 and 1 rows (two each); 3 rows are padded to 4
    assert graphs.replays == {4: 3, 2: 2, 1: 2}
    for prompt, params, output in zip(PROMPTS, PARAMS, outputs, strict=True):
        assert output.outputs[0].token_ids == _hf_greedy(
            tiny_llama, tuple(prompt), params.max_tokens
        )


class NoHostSync(TorchDispatchMode):
    """Fails on the ops that would make a CUDA stream wait for the host, or pick a shape from
    device values: a forward that runs clean under it can be recorded as a CUDA graph."""

    SYNCING = {
        torch.ops.aten._local_scalar_dense,
        torch.ops.aten.is_nonzero,
        torch.ops.aten.nonzero,
        torch.ops.aten.masked_select,
        torch.ops.aten.unique_consecutive,
        torch.ops.aten._unique2,
        torch.ops.aten.bincount,  # sizes its output by the largest value (an H200 capture failed)
    }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.SYNCING:
            raise AssertionError(f"host sync in a graph-captured forward: {func}")
        return func(*args, **(kwargs or {}))


class NoHostSyncBackend(cuda_graph.RerunBackend):
    name = "no-host-sync"

    def capture(self, run):
        def replay():
            with NoHostSync():
                return run()

        return replay


@pytest.mark.parametrize(
    ("attention", "engine_args"),
    [
        ("TRITON_ATTN", {}),
        ("TRITON_ATTN", {"kv_cache_dtype": "fp8", "calculate_kv_scales": True}),
        ("TRITON_ATTN", {"quantization": "fp8"}),
        ("TORCH_SDPA", {}),
    ],
    ids=["triton", "triton-fp8-kv-cache", "triton-fp8-weights", "torch-sdpa"],
)
def test_graph_forward_never_waits_for_the_host(tiny_llama, monkeypatch, attention, engine_args):
    """The whole replayed forward on the Triton kernels (norms, rotary, linear, store_kv, split-K
    decode; fp8 cache and weights too) is free of host syncs; the TORCH_SDPA ops are not (they
    plan each step on the host), which is why TORCH_SDPA decode is never captured."""
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", attention)
    common = dict(
        dtype="float32",
        max_model_len=512,
        num_gpu_blocks_override=64,
        block_size=8,
        max_num_seqs=4,
        **engine_args,
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    prompts = PROMPTS[:3]
    monkeypatch.setattr(cuda_graph, "select_graph_backend", lambda device: NoHostSyncBackend())
    llm = LLM(tiny_llama, cuda_graph_sizes=[1, 2, 4], max_seq_len_to_capture=512, **common)
    if attention == "TORCH_SDPA":
        # As on a GPU, where the C kernels never run: they work outside torch's dispatcher,
        # so this mode could not see the host work in them (the KV writes' slot checks).
        monkeypatch.setattr(native, "load", lambda name: None)
        with pytest.raises(AssertionError, match="host sync in a graph-captured forward"):
            llm.generate(prompts, greedy)
        return
    eager = [
        o.outputs[0].token_ids
        for o in LLM(tiny_llama, enforce_eager=True, **common).generate(prompts, greedy)
    ]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == eager
    assert llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs.replays == {
        4: 2
    }
    if not engine_args:
        for prompt, tokens in zip(prompts, eager, strict=True):
            assert tokens == _hf_greedy(tiny_llama, tuple(prompt), 3)


def test_deepseek_graph_forward_never_waits_for_the_host(tmp_path, monkeypatch):
    """DeepSeek-V3's replayed decode (absorbed latent attention, grouped sigmoid routing, the
    fused experts) on the Triton kernels has no host sync, and generates what transformers does."""
    from infernetes.runtime.testing import make_tiny_model

    path = str(make_tiny_model(tmp_path, "DeepseekV3ForCausalLM"))
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    monkeypatch.setattr(cuda_graph, "select_graph_backend", lambda device: NoHostSyncBackend())
    llm = LLM(
        path,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=32,
        block_size=8,
        max_num_seqs=4,
        cuda_graph_sizes=[1, 2, 4],
        max_seq_len_to_capture=128,
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    prompts = PROMPTS[:3]
    outputs = llm.generate(prompts, greedy)
    assert llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs.replays
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == _hf_greedy(path, tuple(prompt), 3)
