"""A GGUF file as the model: greedy tokens equal transformers' (loaded with ``gguf_file=``) in
float32, the blocks stay quantized on the CPU, and what does not fit is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from infernetes.runtime.engine.engine_config import resolve_config
from infernetes.runtime.llm import LLM
from infernetes.runtime.model_executor.gguf_checkpoint import load_config
from infernetes.runtime.model_executor.layers.embedding import ParallelLMHead
from infernetes.runtime.model_executor.layers.linear import LinearBase
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight
from infernetes.runtime.model_executor.loader import ModelLoadError
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing_gguf import held_tensor_bytes, hf_gguf_greedy, write_gguf

from infernetes.schema.config import build_config
from infernetes.schema.errors import ConfigError

PROMPTS = [[1, 5, 9, 23, 77], [1, 300, 2, 41], [1, 17, 17, 17, 101, 250, 3]]
MAX_TOKENS = 8
SMALL = dict(dtype="float32", max_model_len=256, max_num_seqs=4)


@pytest.fixture(scope="module")
def tied_llama(model_factory) -> str:
    return model_factory("LlamaForCausalLM", tie_word_embeddings=True)


def write(model_dir: str, folder: Path, qtype: Q, types: dict[str, Q] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_gguf(model_dir, folder / f"tiny-{qtype.name}.gguf", qtype, types=types)


def engine_model(llm: LLM):
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner.model


@pytest.mark.parametrize(
    ("qtype", "tied"),
    [
        (Q.F32, False),
        (Q.Q8_0, True),
        (Q.Q4_0, False),
        (Q.Q4_1, True),
        (Q.Q5_0, False),
        (Q.Q5_1, True),
    ],
    ids=["F32", "Q8_0-tied", "Q4_0", "Q4_1-tied", "Q5_0", "Q5_1-tied"],
)
def test_greedy_tokens_equal_transformers_gguf(
    tiny_llama, tied_llama, tmp_path, qtype: Q, tied: bool
):
    file = write(tied_llama if tied else tiny_llama, tmp_path, qtype)
    llm = LLM(str(file), tokenizer=tied_llama if tied else tiny_llama, **SMALL)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
    )
    assert [list(o.outputs[0].token_ids) for o in outputs] == [
        hf_gguf_greedy(file, p, MAX_TOKENS) for p in PROMPTS
    ]
    model = engine_model(llm)
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    kept = [m for m in linears if isinstance(m.quant_method, GroupQuantWeight)]
    if qtype == Q.F32:
        assert not kept
        return
    # On the CPU every linear layer (QKV and gate/up joined) and the vocabulary stay as blocks.
    assert len(kept) == len(linears) and all(m.weight.numel() == 0 for m in kept)
    assert {m.quant_method.bits for m in kept} == {4 if qtype in (Q.Q4_0, Q.Q4_1) else 8}
    embedding = model.model.embed_tokens
    assert isinstance(embedding.quantized, GroupQuantWeight) and embedding.weight.numel() == 0
    head = model.lm_head
    assert isinstance(head, ParallelLMHead) and isinstance(head.quantized, GroupQuantWeight)
    assert (head.quantized is embedding.quantized) == tied


@pytest.mark.parametrize(
    ("architecture", "overrides"),
    [
        ("Qwen2ForCausalLM", {}),
        # transformers' GGUF reader gives Qwen3 its default head size, as real Qwen3s have
        ("Qwen3ForCausalLM", {"head_dim": 128}),
        # ... and Phi-3 a whole rotary head (the tiny Phi-3 rotates half of each)
        ("Phi3ForCausalLM", {"partial_rotary_factor": 1.0}),
        ("Gemma2ForCausalLM", {}),
        ("Gemma3ForCausalLM", {}),
    ],
    ids=["Qwen2", "Qwen3", "Phi3", "Gemma2", "Gemma3"],
)
def test_other_families_equal_transformers_gguf(model_factory, tmp_path, architecture, overrides):
    """Qwen2 (Q/K/V biases, a tied head, rows not interleaved), Qwen3 (Q/K norms), Phi-3 (Q/K/V
    and gate/up stored fused), Gemma 2 and 3 (norms stored as ``1 + w``)."""
    model_dir = model_factory(architecture, **overrides)
    file = write(model_dir, tmp_path, Q.Q8_0)
    llm = LLM(str(file), tokenizer=model_dir, **SMALL)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
    )
    assert [list(o.outputs[0].token_ids) for o in outputs] == [
        hf_gguf_greedy(file, p, MAX_TOKENS) for p in PROMPTS
    ]


@pytest.mark.parametrize(
    ("architecture", "overrides", "qtype"),
    [
        ("Qwen3ForCausalLM", {}, Q.F32),
        ("Phi3ForCausalLM", {}, Q.F32),
        ("Qwen3MoeForCausalLM", {}, Q.F32),
        ("Qwen3MoeForCausalLM", {}, Q.Q8_0),
        ("Qwen2MoeForCausalLM", {"mlp_only_layers": []}, Q.F16),
        ("MixtralForCausalLM", {}, Q.F32),
    ],
    ids=["Qwen3", "Phi3", "Qwen3Moe", "Qwen3Moe-Q8_0", "Qwen2Moe-F16", "Mixtral"],
)
def test_shapes_come_from_the_file(model_factory, tmp_path, architecture, overrides, qtype):
    """Sizes from the file's metadata, where transformers' reader takes its config defaults: a
    Qwen3 with heads of 32 (not 128), a Phi-3 rotating half of each head (Phi-4-mini rotates
    3/4), Qwen MoE expert sizes (stacked experts, 3-d blocks dequantized per expert), a Mixtral
    (written as a Llama with experts, which transformers reads as a dense Llama) give the
    original checkpoint's greedy tokens (F16, Q8_0: transformers' load of the file, given the
    config the file describes)."""
    model_dir = model_factory(architecture, **overrides)
    file = write(model_dir, tmp_path, qtype)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    from_file = LLM(str(file), tokenizer=model_dir, **SMALL).generate(prompts, params)
    tokens = [list(o.outputs[0].token_ids) for o in from_file]
    if qtype == Q.F32:
        original = LLM(model_dir, **SMALL).generate(prompts, params)
        assert tokens == [list(o.outputs[0].token_ids) for o in original]
    else:
        assert tokens == [hf_gguf_greedy(file, p, MAX_TOKENS, load_config(file)) for p in PROMPTS]


@pytest.mark.parametrize(
    ("qtype", "types"),
    [
        (Q.Q4_K, None),
        (Q.Q5_K, None),
        (Q.Q6_K, None),
        (Q.Q4_K, {"attn_v": Q.Q6_K, "ffn_up": Q.Q8_0}),
    ],
    ids=["Q4_K", "Q5_K", "Q6_K", "Q4_K-mixed"],
)
def test_k_quants_equal_transformers_gguf(model_factory, tmp_path, qtype: Q, types):
    """Random K-quant blocks (the gguf package does not quantize these) in a Llama whose rows
    are whole super-blocks of 256; mixed, a fused layer's parts of different types are joined
    in one form (8 bits, groups of 16)."""
    model_dir = model_factory("LlamaForCausalLM", hidden_size=256, intermediate_size=512)
    file = write(model_dir, tmp_path, qtype, types)
    llm = LLM(str(file), tokenizer=model_dir, **SMALL)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
    )
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    assert tokens == [hf_gguf_greedy(file, p, MAX_TOKENS) for p in PROMPTS]
    assert len({t for row in tokens for t in row}) > 1  # not a constant output
    kept = [m.quant_method for m in engine_model(llm).modules() if isinstance(m, LinearBase)]
    assert all(isinstance(k, GroupQuantWeight) for k in kept)


def test_dense_at_load_where_blocks_are_not_kept(tiny_llama, tmp_path, monkeypatch, caplog):
    """The GPU's path (no kernels for GGUF blocks yet), run on the CPU: every block dequantised
    at load, one log line, the same tokens."""
    import logging

    from infernetes.runtime.model_executor import gguf_checkpoint

    monkeypatch.setattr(gguf_checkpoint, "keeps_quantized", lambda device: False)
    file = write(tiny_llama, tmp_path, Q.Q4_1)
    with caplog.at_level(logging.INFO, logger=gguf_checkpoint.__name__):
        llm = LLM(str(file), tokenizer=tiny_llama, **SMALL)
    # 7 per layer, the embedding and the output layer
    assert "GGUF: 16 quantized tensors dequantised to float32 at load" in caplog.text
    model = engine_model(llm)
    assert not any(
        isinstance(getattr(m, "quant_method", None), GroupQuantWeight) for m in model.modules()
    )
    assert model.model.embed_tokens.quantized is None
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
    )
    assert [list(o.outputs[0].token_ids) for o in outputs] == [
        hf_gguf_greedy(file, p, MAX_TOKENS) for p in PROMPTS
    ]


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q5_1], ids=lambda t: t.name)
def test_int8_activations_keep_greedy_tokens(tiny_llama, tmp_path, monkeypatch, qtype: Q):
    """bf16 decode on Q8_0/Q4_1/Q5_1 blocks multiplies x quantized to int8 (kernels/cpu/int8_linear.py,
    llama.cpp's method). The greedy tokens stay those of the same blocks with bf16 x up to a
    near tie of the random model's logits: where they part, the int8 run's token was within
    NEAR_TIE of the best by the bf16 run's own log-probabilities."""
    from infernetes.kernels.cpu import int8_linear

    near_tie = 0.05
    file = write(tiny_llama, tmp_path, qtype)
    calls = []
    counted = int8_linear.linear
    monkeypatch.setattr(int8_linear, "linear", lambda *a: calls.append(1) or counted(*a))

    def greedy():
        llm = LLM(str(file), tokenizer=tiny_llama, **{**SMALL, "dtype": "bfloat16"})
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in PROMPTS],
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=5),
        )
        return [o.outputs[0] for o in outputs]

    with_int8 = greedy()
    assert calls  # decode's rows took the int8 kernel
    monkeypatch.setattr(int8_linear, "max_rows", lambda bits: 0)
    calls.clear()
    with_bf16 = greedy()
    assert not calls
    for int8_run, bf16_run in zip(with_int8, with_bf16, strict=True):
        tokens, reference = list(int8_run.token_ids), list(bf16_run.token_ids)
        if tokens == reference:
            continue
        step = next(i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b)
        chances = {t: lp.logprob for t, lp in bf16_run.logprobs[step].items()}
        assert tokens[step] in chances, (step, tokens, reference)
        assert chances[reference[step]] - chances[tokens[step]] < near_tie


def test_folder_and_load_format_gguf(tiny_llama, tmp_path):
    file = write(tiny_llama, tmp_path / "one", Q.Q8_0)
    for model, load_format in [(file.parent, "auto"), (file.parent, "gguf"), (file, "gguf")]:
        runtime, _ = resolve_config(
            build_config(str(model), tokenizer=tiny_llama, load_format=load_format, **SMALL)
        )
        assert runtime.model.info.path == file
        assert runtime.model.quantization == "gguf"  # as vLLM settles it for a GGUF file
        assert runtime.model.info.architecture == "LlamaForCausalLM"
    # The context length comes from the file's metadata (llama.context_length) ...
    runtime, _ = resolve_config(build_config(str(file), tokenizer=tiny_llama, dtype="float32"))
    assert runtime.model.max_model_len == 512
    # ... or from the config --hf-config-path names.
    other = tmp_path / "config"
    shutil.copytree(tiny_llama, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 300}))
    runtime, _ = resolve_config(
        build_config(str(file), tokenizer=tiny_llama, hf_config_path=str(other))
    )
    assert runtime.model.max_model_len == 300


def test_config_command_says_what_serve_resolves(tiny_llama, tmp_path, capsys, monkeypatch):
    """``infernetes config`` on a GGUF file runs the engine's resolution: quantization gguf, the
    metadata's context length."""
    from infernetes.cli import main as cli_main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what `config` sets; restored after the test
    file = write(tiny_llama, tmp_path, Q.Q4_0)
    assert cli_main.main(["config", str(file), "--tokenizer", tiny_llama]) in (0, None)
    printed = {
        k: v for group in json.loads(capsys.readouterr().out).values() for k, v in group.items()
    }
    runtime, _ = resolve_config(build_config(str(file), tokenizer=tiny_llama))
    assert printed["quantization"] == runtime.model.quantization == "gguf"
    assert printed["max_model_len"] == runtime.model.max_model_len == 512
    assert printed["dtype"] == str(runtime.model.info.dtype).removeprefix("torch.")


def test_refusals(tiny_llama, tmp_path):
    file = write(tiny_llama, tmp_path / "one", Q.Q4_0)
    with pytest.raises(ModelLoadError, match="does not read it"):
        resolve_config(build_config(str(file), tokenizer=tiny_llama, load_format="safetensors"))
    with pytest.raises(ConfigError, match="contradicts"):
        resolve_config(build_config(str(file), tokenizer=tiny_llama, quantization="gptq"))
    with pytest.raises(ConfigError, match="needs a GGUF file"):
        resolve_config(build_config(tiny_llama, quantization="gguf"))
    with pytest.raises(ModelLoadError, match="exactly one"):
        resolve_config(build_config(tiny_llama, load_format="gguf"))
    two = tmp_path / "two"
    shutil.copytree(file.parent, two)
    shutil.copy(file, two / "copy.gguf")
    with pytest.raises(ModelLoadError, match="exactly one"):
        resolve_config(build_config(str(two), tokenizer=tiny_llama, load_format="gguf"))


def test_unsupported_tensor_type_is_named(tiny_llama, tmp_path):
    """A block type the loader does not convert stops the load, naming the tensor and type."""
    from gguf import GGUFReader

    file = write(tiny_llama, tmp_path / "q8", Q.Q8_0)
    reader = GGUFReader(file)
    odd = tmp_path / "odd" / "tiny-iq4.gguf"
    odd.parent.mkdir()
    writer = GGUFWriter(str(odd), "llama")
    for field in reader.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    for tensor in reader.tensors:
        if tensor.name == "blk.1.ffn_up.weight":
            blocks = torch.randint(0, 256, (128, 2 * 18), dtype=torch.uint8).numpy()  # 64 wide
            writer.add_tensor(tensor.name, blocks, raw_dtype=Q.IQ4_NL)
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"'blk\.1\.ffn_up\.weight' .*IQ4_NL"):
        LLM(str(odd), tokenizer=tiny_llama, **SMALL)


@pytest.mark.slow  # loads the real 135M-parameter demo model (about half a minute here)
def test_demo_model_answers():
    from infernetes.runtime.server.demo import demo_gguf

    llm = LLM(str(demo_gguf()), max_model_len=512)
    [output] = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(max_tokens=24, temperature=0),
    )
    assert "Paris" in output.outputs[0].text


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_4bit_weights_stay_near_the_files_bytes(tiny_llama, tied_llama, tmp_path, tied: bool):
    """A Q4_1 file held as its blocks, byte for byte: float16 scales and offsets as the file
    stores them (float32 ones made 24 bytes of a 20-byte block, 1.2x), and no dense copy of any
    weight (the vocabulary's least of all: bf16 would be 3.2x its blocks) beside them."""
    from gguf import GGUFReader

    file = write(tied_llama if tied else tiny_llama, tmp_path, Q.Q4_1, types=None)
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(file).tensors)
    llm = LLM(str(file), tokenizer=tied_llama if tied else tiny_llama, **SMALL)
    held = held_tensor_bytes(engine_model(llm))
    assert held <= 1.02 * file_bytes, (held, file_bytes)
