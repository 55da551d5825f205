"""Decode CUDA graphs: capture sizes and settings from the serve arguments, the static-buffer
replay with padding (a fake forward, then the real engine with the ``RerunBackend``, whose replay
re-runs the forward on the static buffers), and -O / --compilation-config. Real CUDA graphs: the
gpu-marked tests at the end."""

from __future__ import annotations

import logging

import pytest
import torch
from infernetes.runtime.model_executor import cuda_graph
from infernetes.runtime.model_executor.compilation import (
    CompilationSettings,
    compile_forward,
    parse_compilation_config,
)
from infernetes.runtime.model_executor.context import AttentionMetadata, get_attention_metadata
from infernetes.runtime.model_executor.cuda_graph import (
    DecodeGraphs,
    DecodeGraphSettings,
    RerunBackend,
    capture_sizes,
    decode_graph_settings,
)

from infernetes.schema.config import build_config

# -- which sizes, from which arguments -------------------------------------------------------------


def test_one_value_is_vllms_pattern_up_to_max_num_seqs():
    assert capture_sizes([512], max_num_seqs=256) == (1, 2, 4, *range(8, 257, 8))
    assert capture_sizes([512], max_num_seqs=1024) == (1, 2, 4, *range(8, 513, 8))
    assert capture_sizes([20], max_num_seqs=256) == (1, 2, 4, 8, 16)


def test_a_size_that_holds_max_num_seqs_is_kept():
    # 12 rows fit no size up to 12: the next one (16) is kept so every decode batch has a graph
    assert capture_sizes([512], max_num_seqs=12) == (1, 2, 4, 8, 16)
    assert capture_sizes([1, 3, 100, 200], max_num_seqs=50) == (1, 3, 100)
    assert capture_sizes([512], max_num_seqs=8) == (1, 2, 4, 8)


def test_several_values_override_and_cap():
    assert capture_sizes([16, 2, 8, 2], max_num_seqs=256) == (2, 8, 16)
    assert capture_sizes([512], max_num_seqs=256, override=[4, 1]) == (1, 4)
    assert capture_sizes([512], max_num_seqs=256, max_capture_size=20) == (1, 2, 4, 8, 16)


@pytest.mark.parametrize("sizes", [[0], [4, -1]])
def test_bad_sizes_name_the_argument(sizes):
    with pytest.raises(ValueError, match="--cuda-graph-sizes must be positive integers"):
        capture_sizes(sizes, max_num_seqs=8)
    with pytest.raises(ValueError, match=r"compilation_config\.cudagraph_capture_sizes"):
        capture_sizes([512], max_num_seqs=8, override=sizes)


def test_settings_from_serve_arguments(caplog):
    cfg = build_config("m", cuda_graph_sizes=[8], max_seq_len_to_capture=100)
    settings = decode_graph_settings(cfg, CompilationSettings(), max_num_seqs=16, max_model_len=64)
    assert settings == DecodeGraphSettings(
        sizes=(1, 2, 4, 8), max_seq_len=64
    )  # capped at max_model_len
    settings = decode_graph_settings(
        cfg, CompilationSettings(), max_num_seqs=16, max_model_len=4096
    )
    assert settings.max_seq_len == 100
    with caplog.at_level(logging.INFO, logger=cuda_graph.__name__):
        assert (
            decode_graph_settings(
                build_config("m", enforce_eager=True), CompilationSettings(), 16, 64
            )
            is None
        )
        off = parse_compilation_config({"cudagraph_mode": "NONE"})
        assert decode_graph_settings(build_config("m"), off, 16, 64) is None
    assert "CUDA graphs are off (--enforce-eager)" in caplog.text
    assert "CUDA graphs are off (compilation_config)" in caplog.text


def test_cpu_device_replays_its_c_kernels_unless_they_are_off(monkeypatch, caplog):
    assert isinstance(
        cuda_graph.select_graph_backend(torch.device("cpu")), cuda_graph.CpuKernelBackend
    )
    monkeypatch.setenv("INFERNETES_CPU_KERNELS", "0")
    with caplog.at_level(logging.INFO, logger=cuda_graph.__name__):
        assert cuda_graph.select_graph_backend(torch.device("cpu")) is None
    assert "CPU decode steps run eagerly (C kernels off" in caplog.text


def test_other_devices_have_no_graph_backend(caplog):
    with caplog.at_level(logging.INFO, logger=cuda_graph.__name__):
        assert cuda_graph.select_graph_backend(torch.device("meta")) is None
    assert "CUDA graphs need a CUDA device" in caplog.text


def test_reference_attention_on_cuda_runs_decode_eagerly(monkeypatch, caplog):
    # TORCH_SDPA plans each step on the host (.tolist()), which a CUDA graph cannot replay
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TORCH_SDPA")
    with caplog.at_level(logging.WARNING, logger=cuda_graph.__name__):
        assert cuda_graph.select_graph_backend(torch.device("cuda")) is None
    assert "CUDA graphs need the TRITON_ATTN attention backend (TORCH_SDPA" in caplog.text


# -- -O / --compilation-config ---------------------------------------------------------------------


def test_compilation_config_levels_and_keys(caplog):
    assert parse_compilation_config({}) == CompilationSettings()
    assert parse_compilation_config({"level": 3}).level == 3
    assert parse_compilation_config({"mode": 2}).level == 2
    settings = parse_compilation_config(
        {
            "level": 1,
            "use_inductor": False,
            "cudagraph_capture_sizes": [1, 2],
            "max_capture_size": 2,
        }
    )
    assert settings == CompilationSettings(
        level=1, backend="eager", capture_sizes=(1, 2), max_capture_size=2
    )
    newer = parse_compilation_config({"max_cudagraph_capture_size": 8})  # vLLM >= 0.11's name
    assert newer.max_capture_size == 8
    with caplog.at_level(logging.WARNING):
        parse_compilation_config({"level": 3, "splitting_ops": ["x"]})
    assert "splitting_ops have no effect" in caplog.text


@pytest.mark.parametrize(
    "value, message",
    [
        ({"level": 4}, "compilation_config.level .-O. must be one of 0, 1, 2, 3"),
        ({"level": "3"}, "compilation_config.level must be an integer"),
        ({"levle": 3}, "compilation_config has unknown key.s. levle"),
        (
            {"backend": "no-such-backend"},
            "compilation_config.backend 'no-such-backend' is not a torch.compile backend",
        ),
        ({"cudagraph_mode": "SOMETIMES"}, "compilation_config.cudagraph_mode must be one of NONE"),
        ({"cudagraph_capture_sizes": 4}, "cudagraph_capture_sizes must be a list"),
    ],
)
def test_compilation_config_errors(value, message):
    with pytest.raises(ValueError, match=message):
        parse_compilation_config(value)


def test_levels_on_the_cpu_run_eagerly_with_a_log_line(caplog):
    model = torch.nn.Linear(2, 2)
    cpu = torch.device("cpu")
    assert compile_forward(model, CompilationSettings(level=0), cpu) is model
    with caplog.at_level(logging.INFO):
        assert compile_forward(model, CompilationSettings(level=3), cpu) is model
    assert "compilation level 3 (piecewise compile) is not applied on cpu" in caplog.text
    compiled = compile_forward(model, CompilationSettings(level=3, backend="eager"), cpu)
    assert compiled is not model and isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)


# -- replay over static buffers, with a fake forward ------------------------------------------------


class RecordingForward:
    """Stands in for the model: records what each call sees and returns a row per input id."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        meta = get_attention_metadata()
        self.calls.append(
            {
                "input_ids": input_ids.tolist(),
                "positions": positions.tolist(),
                "slots": meta.slot_mapping.tolist(),
                "seq_lens": meta.seq_lens.tolist(),
                "cu": meta.cu_seqlens_q.tolist(),
                "tables": meta.block_tables.tolist(),
            }
        )
        return torch.stack([input_ids.float(), positions.float()], dim=1)


def _decode_meta(slots, seq_lens, tables, query_tokens=None):
    n = len(seq_lens)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        block_tables=torch.tensor(tables, dtype=torch.int32).reshape(n, -1),
        cu_seqlens_q=torch.tensor(query_tokens or list(range(n + 1)), dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
    )


def _graphs(forward, sizes=(1, 2, 4, 8), max_seq_len=64):
    graphs = DecodeGraphs(
        forward, DecodeGraphSettings(sizes, max_seq_len), 16, torch.device("cpu"), RerunBackend()
    )
    graphs.capture()
    return graphs


def test_replay_pads_to_the_next_size_with_rows_that_write_and_read_nothing():
    forward = RecordingForward()
    graphs = _graphs(forward)
    assert graphs.block_tables.shape == (8, 4)  # max_seq_len 64 / block size 16
    meta = _decode_meta([37, 70, 5], [6, 23, 38], [[2, 0, 0], [3, 4, 0], [0, 1, 9]])
    out = graphs.run(torch.tensor([11, 12, 13]), torch.tensor([5, 22, 37]), meta)
    assert out.tolist() == [[11, 5], [12, 22], [13, 37]]
    seen = forward.calls[-1]
    assert seen["input_ids"] == [11, 12, 13, 0] and seen["positions"] == [5, 22, 37, 0]
    assert seen["slots"] == [37, 70, 5, -1] and seen["seq_lens"] == [6, 23, 38, 0]
    assert seen["cu"] == [0, 1, 2, 3, 4]
    assert [row[:3] for row in seen["tables"][:3]] == [[2, 0, 0], [3, 4, 0], [0, 1, 9]]
    assert len(seen["tables"][0]) == 4  # the static width, whatever this batch's
    assert graphs.replays == {4: 1}
    # a smaller batch later: the rows it no longer uses become padding again
    graphs.run(torch.tensor([21]), torch.tensor([9]), _decode_meta([9], [10], [[0]]))
    graphs.run(
        torch.tensor([21, 22]), torch.tensor([9, 3]), _decode_meta([9, 40], [10, 4], [[0], [2]])
    )
    assert forward.calls[-1]["slots"] == [9, 40] and graphs.replays == {4: 1, 1: 1, 2: 1}


def test_batches_that_run_eagerly():
    graphs = _graphs(RecordingForward(), sizes=(1, 2, 4))
    one = ([7], [8], [[0]])
    # prefill or mixed: more query tokens than sequences
    prefill = _decode_meta([0, 1, 2], [3], [[0]], query_tokens=[0, 3])
    assert graphs.run(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]), prefill) is None
    # larger than the largest size
    five = _decode_meta(list(range(5)), [1] * 5, [[0]] * 5)
    assert graphs.run(torch.arange(5), torch.zeros(5, dtype=torch.long), five) is None
    # a block table wider than --max-seq-len-to-capture allows
    wide = _decode_meta([7], [65], [[0, 1, 2, 3, 4]])
    assert graphs.run(torch.tensor([1]), torch.tensor([64]), wide) is None
    # measuring fp8 scales (the first batch with --calculate-kv-scales)
    measuring = _decode_meta(*one)
    measuring.calculate_kv_scales = True
    assert graphs.run(torch.tensor([1]), torch.tensor([7]), measuring) is None
    assert not graphs.replays
    assert graphs.run(torch.tensor([1]), torch.tensor([7]), _decode_meta(*one)) is not None


# -- the real engine, graphs replayed by re-running the forward on the static buffers ----------------


@pytest.fixture
def rerun_graphs(monkeypatch):
    """Every engine built in the test gets graphs on the CPU, through the RerunBackend."""
    monkeypatch.setattr(cuda_graph, "select_graph_backend", lambda device: RerunBackend())


PROMPTS = [[5 + i, 7, 9, 11 + i] * (i + 1) for i in range(6)]


def _params(n: int):
    from infernetes import SamplingParams

    # different lengths: the decode batch shrinks 6, 5, 4, 3, 2, 1 as requests finish
    return [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(n)]


def _generate(llm, prompts=PROMPTS):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, _params(len(prompts)))]


@pytest.fixture(scope="module")
def eager_run(tiny_llama):
    from infernetes import LLM

    llm = LLM(tiny_llama, num_gpu_blocks_override=64, enforce_eager=True, seed=0)
    return _generate(llm), [
        layer.k_cache.clone()
        for layer in llm.llm_engine.engine_core.executor.driver_worker.model_runner.attention_layers
    ]


def test_graph_replay_gives_the_eager_tokens_for_several_batch_sizes(
    tiny_llama, rerun_graphs, eager_run, caplog
):
    from infernetes import LLM

    with caplog.at_level(logging.INFO, logger=cuda_graph.__name__):
        llm = LLM(
            tiny_llama,
            num_gpu_blocks_override=64,
            cuda_graph_sizes=[1, 2, 4, 8],
            max_num_seqs=8,
            seed=0,
        )
    assert (
        "Capturing CUDA graphs for 4 batch sizes (1, 2, 4, 8) with the rerun backend" in caplog.text
    )
    tokens, eager_caches = eager_run
    assert _generate(llm) == tokens
    graphs = llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs
    # two decode steps each of 6, 5, 4, 3, 2 and 1 rows: 6 and 5 padded to 8, 3 to 4
    assert graphs.replays == {8: 4, 4: 4, 2: 2, 1: 2}
    # padding rows wrote nowhere: the caches hold exactly what the eager run wrote
    for eager_cache, layer in zip(
        eager_caches,
        llm.llm_engine.engine_core.executor.driver_worker.model_runner.attention_layers,
        strict=True,
    ):
        torch.testing.assert_close(layer.k_cache, eager_cache, rtol=1e-5, atol=1e-5)


def test_long_sequences_and_large_batches_fall_back_to_eager(tiny_llama, rerun_graphs, eager_run):
    from infernetes import LLM, SamplingParams

    # graphs only up to 2 rows and 16 tokens: the 6-row steps run eagerly
    llm = LLM(
        tiny_llama,
        num_gpu_blocks_override=64,
        cuda_graph_sizes=[1, 2],
        max_seq_len_to_capture=16,
        seed=0,
    )
    assert _generate(llm) == eager_run[0]
    graphs = llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs
    assert graphs.max_blocks == 1 and set(graphs.replays) <= {1, 2}
    # two short prompts growing past 16 tokens: replayed while they fit one block, eager after
    prompts, params = (
        [[5, 7, 9], [11, 12]],
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
    )
    graphs.replays.clear()
    replayed = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert graphs.replays == {
        2: 13
    }  # steps with seq_len 4 .. 16 fit one block; 17 .. 22 run eagerly
    eager = LLM(tiny_llama, num_gpu_blocks_override=64, enforce_eager=True, seed=0)
    assert replayed == [o.outputs[0].token_ids for o in eager.generate(prompts, params)]


def test_sleep_drops_the_graphs_and_wake_up_captures_them_again(
    tiny_llama, rerun_graphs, eager_run
):
    from infernetes import LLM

    llm = LLM(
        tiny_llama,
        num_gpu_blocks_override=64,
        cuda_graph_sizes=[8],
        max_num_seqs=8,
        seed=0,
        enable_sleep_mode=True,
    )
    runner = llm.llm_engine.engine_core.executor.driver_worker.model_runner
    first = runner.decode_graphs
    for level in (1, 2):
        llm.sleep(level)
        assert runner.decode_graphs is None
        llm.wake_up()
        assert runner.decode_graphs is not None and runner.decode_graphs is not first
    assert _generate(llm) == eager_run[0]


@pytest.mark.slow
def test_compiled_forward_on_the_cpu_with_the_eager_backend(tiny_llama, rerun_graphs):
    """-O3 with an explicit backend compiles on the CPU too: dynamo traces the model between the
    attention layers, and the graphs replay the compiled forward. (Kept small: tracing is slow.)"""
    from infernetes import LLM, SamplingParams

    prompts, params = (
        [[5, 7, 9], [11, 12, 13, 14, 15]],
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    )
    eager = LLM(tiny_llama, num_gpu_blocks_override=64, enforce_eager=True, seed=0)
    expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    torch._dynamo.reset()
    llm = LLM(
        tiny_llama,
        num_gpu_blocks_override=64,
        compilation_config={"level": 3, "backend": "eager"},
        cuda_graph_sizes=[2],
        max_num_seqs=2,
        seed=0,
    )
    runner = llm.llm_engine.engine_core.executor.driver_worker.model_runner
    assert isinstance(runner.run_model, torch._dynamo.eval_frame.OptimizedModule)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    assert runner.decode_graphs.replays == {2: 3}


# -- real CUDA graphs ---------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.mark.gpu
@needs_gpu
def test_gpu_cuda_graphs_give_the_eager_tokens(tiny_llama, caplog):
    from infernetes import LLM

    prompts = [*PROMPTS, [3, 4] * 20]
    common = dict(dtype="float32", max_num_seqs=16, num_gpu_blocks_override=128, seed=0)
    eager = _generate(LLM(tiny_llama, enforce_eager=True, **common), prompts)
    with caplog.at_level(logging.INFO, logger=cuda_graph.__name__):
        llm = LLM(tiny_llama, **common)
    assert (
        "Capturing CUDA graphs for 5 batch sizes (1, 2, 4, 8, 16) with the cuda backend"
        in caplog.text
    )
    assert _generate(llm, prompts) == eager
    graphs = llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs
    assert isinstance(graphs.backend, cuda_graph.CudaGraphBackend)
    assert set(graphs.replays) == {1, 2, 4, 8}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_graph_step_matches_the_eager_step(tiny_llama, dtype):
    """One padded decode step, replayed from a real CUDA graph and run eagerly on the same inputs."""
    from infernetes import LLM

    llm = LLM(
        tiny_llama,
        dtype=dtype,
        max_num_seqs=8,
        cuda_graph_sizes=[1, 2, 4, 8],
        num_gpu_blocks_override=128,
    )
    runner = llm.llm_engine.engine_core.executor.driver_worker.model_runner
    graphs = runner.decode_graphs
    n, device = 3, runner.device
    seq_lens = torch.tensor([5, 17, 40], dtype=torch.int32, device=device)
    tables = torch.tensor([[0, 0, 0], [1, 2, 0], [3, 4, 5]], dtype=torch.int32, device=device)
    last = (seq_lens - 1).long()
    slots = tables.gather(1, (last // 16)[:, None]).squeeze(1).long() * 16 + last % 16
    meta = AttentionMetadata(
        slots, tables, torch.arange(n + 1, dtype=torch.int32, device=device), seq_lens
    )
    ids = torch.tensor([7, 8, 9], device=device)
    for layer in runner.attention_layers:  # a random cache, so attention reads something
        layer.k_cache.normal_()
        layer.v_cache.normal_()
    replayed = graphs.run(ids, last, meta).clone()
    from infernetes.runtime.model_executor.context import set_attention_metadata

    set_attention_metadata(meta)
    with torch.inference_mode():
        eager = runner.run_model(ids, last)
    set_attention_metadata(None)
    tol = 1e-4 if dtype == "float32" else 3e-2
    torch.testing.assert_close(replayed, eager, rtol=tol, atol=tol)
    assert graphs.replays == {4: 1}


@pytest.mark.gpu
@needs_gpu
def test_gpu_compiled_forward_with_graphs_gives_the_eager_tokens(tiny_llama):
    from infernetes import LLM

    common = dict(dtype="float32", max_num_seqs=8, num_gpu_blocks_override=128, seed=0)
    eager = _generate(LLM(tiny_llama, enforce_eager=True, **common))
    llm = LLM(tiny_llama, compilation_config={"level": 3}, **common)
    assert _generate(llm) == eager
