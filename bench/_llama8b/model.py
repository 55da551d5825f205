"""The Llama-3.1-8B shape (and a tiny one for --smoke), its dummy-weight engine, the workload and
the bytes a decode step reads, shared by the gpu_llama8b benchmarks."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._gpu import run_part

# config.json of meta-llama/Llama-3.1-8B-Instruct (shape only; the weights are dummies)
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}

TINY = {
    **LLAMA_31_8B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

# The quantization_config each quantized variant's config.json declares.
QUANTIZED = {
    "w4a16": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic"},
}


@dataclass
class PartRunner:
    """Runs a part of gpu_llama8b in a process of its own, on a model folder of this run."""

    argv: list[str]
    model_dir: Path
    tmp: Path
    smoke: bool

    def __call__(self, part: str, model_dir: Path | None = None, triton: bool = False) -> dict:
        return run_part(
            part,
            self.argv,
            model_dir or self.model_dir,
            self.smoke,
            triton,
            module="bench.gpu_llama8b",
        )


def write_model_dir(directory: Path, smoke: bool, quantization: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(TINY if smoke else LLAMA_31_8B)
    if quantization is not None:
        config["quantization_config"] = QUANTIZED[quantization]
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def workload(args: argparse.Namespace, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request, the same in every process."""
    rng = random.Random(args.seed)
    requests = []
    for _ in range(args.requests):
        prompt_len = rng.randint(args.min_len, args.max_len)
        requests.append(
            (
                [rng.randrange(1000 if vocab > 2000 else 3, vocab) for _ in range(prompt_len)],
                rng.randint(args.min_len, args.max_len),
            )
        )
    return requests


def model_config(args: argparse.Namespace) -> dict:
    return TINY if args.smoke else LLAMA_31_8B


def llm(args: argparse.Namespace, **overrides: Any) -> Any:
    from infernetes import LLM

    engine_args = {**json.loads(args.engine_args), **overrides}
    return LLM(
        args.model_dir,
        load_format="dummy",
        dtype="bfloat16" if not args.smoke else "float32",
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        seed=args.seed,
        **engine_args,
    )


def weight_bytes_per_token(config: dict, quantization: str | None = None) -> int:
    """Bytes of weights a decode step reads: every matrix but the embedding table (one row). A
    quantized variant's linear layers read 4 bits a weight and a 2-byte scale per group of 128
    (w4a16) or a byte a weight (fp8); norms and the LM head stay in the model dtype."""
    h, i, n = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    q = config["num_attention_heads"] * config["head_dim"]
    linear = h * q + 2 * h * kv + q * h + 3 * h * i
    bytes_per_param = 2 if config["torch_dtype"] == "bfloat16" else 4
    per_linear_param = {None: bytes_per_param, "w4a16": 0.5 + 2 / 128, "fp8": 1.0}[quantization]
    rest = n * 2 * h + h + config["vocab_size"] * h
    return int(n * linear * per_linear_param + rest * bytes_per_param)
