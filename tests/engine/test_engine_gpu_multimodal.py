"""On an NVIDIA GPU, every vision-language model and Whisper generates the CPU's greedy tokens for
the same tiny random model: images of several sizes batched with text-only prompts, under the
decode CUDA graphs (Qwen3-VL's DeepStack and the Pixtral tower included) and with the encoder
budget cutting a step's images; Whisper eagerly, its cross-attention beside the paged cache
(``bench/gpu/run.sh smoke-mm`` runs this file).

The CPU's tokens are the reference here: the CPU tests already hold them equal to transformers'.
Skipped without a GPU (CI).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from infernetes.runtime.testing_audio import make_tiny_whisper, tone
from infernetes.runtime.testing_vision import (
    GEMMA3_BOI,
    QWEN_IMAGE,
    make_tiny_gemma3,
    make_tiny_llava,
    make_tiny_llava_next,
    make_tiny_mistral3,
    make_tiny_pixtral,
    make_tiny_qwen2_vl,
    random_image,
)

from infernetes import SamplingParams

from .gpu_smoke import assert_same_greedy_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

ENGINE = dict(dtype="float32", max_model_len=400, num_gpu_blocks_override=256, block_size=16)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# (width, height) of the images: sizes that give different tilings, grids and token counts.
SIZES = [(40, 36), (70, 50), (30, 90)]

# name -> (writes the tiny model into a folder, the prompt's image placeholder)
VISION: dict[str, tuple[Callable[[Path], Path], str]] = {
    "llava": (make_tiny_llava, "<image>"),
    "llava-next": (make_tiny_llava_next, "<image>"),
    "gemma3": (make_tiny_gemma3, GEMMA3_BOI),
    "qwen2-vl": (make_tiny_qwen2_vl, QWEN_IMAGE),
    "qwen2.5-vl": (lambda d: make_tiny_qwen2_vl(d, version="2.5"), QWEN_IMAGE),
    "qwen3-vl": (lambda d: make_tiny_qwen2_vl(d, version="3"), QWEN_IMAGE),
    "qwen3-vl-moe": (lambda d: make_tiny_qwen2_vl(d, version="3-moe"), QWEN_IMAGE),
    "mistral3": (make_tiny_mistral3, "[IMG]"),
    "pixtral": (make_tiny_pixtral, "[IMG]"),
}


def _prompts(placeholder: str) -> list[Any]:
    """One image, two of other sizes, a text-only prompt and three images between text."""
    return [
        {
            "prompt": f"Describe {placeholder} please.",
            "multi_modal_data": {"image": [random_image(1, SIZES[0])]},
        },
        {
            "prompt": f"Compare {placeholder} with {placeholder}",
            "multi_modal_data": {"image": [random_image(2, SIZES[1]), random_image(3, SIZES[2])]},
        },
        "Hello world, what is the capital of France?",
        {
            "prompt": f"The fox {placeholder} jumps {placeholder} over {placeholder} the dog",
            "multi_modal_data": {"image": [random_image(s, SIZES[s % 3]) for s in (4, 5, 6)]},
        },
    ]


def _assert_same_tokens(path: str, prompts: list[Any], **engine: Any) -> None:
    assert_same_greedy_tokens(path, prompts, GREEDY, {**ENGINE, **engine})


@pytest.mark.parametrize("name", sorted(VISION))
def test_gpu_vision_model_generates_the_cpus_tokens(name, tmp_path):
    write, placeholder = VISION[name]
    _assert_same_tokens(str(write(tmp_path / name)), _prompts(placeholder))


@pytest.mark.parametrize("name", ["qwen2.5-vl", "mistral3"])
def test_gpu_vision_model_under_chunked_prefill_and_eagerly(name, tmp_path):
    """Steps of 24 tokens cut the images between chunks; eager runs leave the graphs out."""
    write, placeholder = VISION[name]
    path = str(write(tmp_path / name))
    _assert_same_tokens(
        path, _prompts(placeholder), enable_chunked_prefill=True, max_num_batched_tokens=24
    )
    _assert_same_tokens(path, _prompts(placeholder), enforce_eager=True)


def test_gpu_whisper_generates_the_cpus_tokens(tmp_path):
    path = str(make_tiny_whisper(tmp_path / "whisper"))
    transcribe = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    prompts = [
        {"prompt": transcribe, "multi_modal_data": {"audio": (tone(seed, seconds), 16000)}}
        for seed, seconds in ((1, 2.0), (2, 5.5), (3, 1.0))
    ]
    _assert_same_tokens(path, prompts, max_model_len=None)
