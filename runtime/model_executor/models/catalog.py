"""docs/reference/models.md: the supported architectures, generated from the registry
(``make generate`` writes it; a test fails when it is stale)."""

from __future__ import annotations

from infernetes.runtime.model_executor.models import ARCHITECTURES, GENERATIVE, POOLING
from infernetes.runtime.model_executor.models.interfaces import (
    is_encoder_decoder,
    supports_multimodal,
)
from infernetes.runtime.testing import FAMILY_CONFIGS  # what the tests run through the fallback
from torch import nn


def _is_moe(cls: type[nn.Module]) -> bool:
    from infernetes.runtime.model_executor.models.moe import MoeForCausalLM

    return issubclass(cls, MoeForCausalLM)


# Tested at the model level only (its processor needs torchvision, which the test environment
# lacks): no test runs it through the engine, on one rank or several.
MODEL_LEVEL_ONLY = {"LlavaOnevisionForConditionalGeneration"}


def _row(architecture: str) -> str:
    cls = ARCHITECTURES[architecture]()
    generative = architecture in GENERATIVE
    ranks_tested = generative and architecture not in MODEL_LEVEL_ONLY
    vision = supports_multimodal(cls)
    one_rank = getattr(cls, "single_rank", False)
    task = "generate" if generative else ("score" if "Classification" in architecture else "embed")
    # The generative models are tested under TP and PP against transformers; the pooling models'
    # layers are the same parallel layers, but no test runs them on several ranks yet. No test
    # runs a vision-language model with fp8 yet.
    cells = [
        f"`{architecture}`",
        "transcription (audio)"
        if is_encoder_decoder(cls)
        else (
            f"{task} (text + {' + '.join(getattr(cls, 'modalities', ('image',)))})"
            if vision
            else task
        ),
        f"`{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}`",
        "no (one rank)" if one_rank else ("yes" if ranks_tested else "untested"),
        "no (one rank)"
        if one_rank
        else ("yes" if ranks_tested else ("untested" if generative else "no")),
        "yes" if generative and not vision and not one_rank else "untested",
        "yes (TP slices every expert; `--enable-expert-parallel` spreads whole experts)"
        if _is_moe(cls)
        else "",
    ]
    return "| " + " | ".join(cells) + " |"


def render_models_markdown() -> str:
    header = (
        "| architecture | task | implementation | tensor parallel | pipeline parallel "
        "| `--quantization fp8` | mixture of experts |\n|---|---|---|---|---|---|---|"
    )
    rows = "\n".join(_row(name) for name in sorted(ARCHITECTURES, key=lambda n: (n in POOLING, n)))
    tested = ", ".join(f"`{name}`" for name in sorted(FAMILY_CONFIGS))
    return f"""# Supported models

Generated from the model registry (`runtime/model_executor/models/__init__.py`) by
`make generate`; do not edit by hand.

## Native implementations

`--model-impl auto` (the default) and `--model-impl vllm` run these with this engine's own
layers, kernels, CUDA graphs and torch.compile.

{header}
{rows}

Sliding windows are honoured per layer (all layers for Mistral and Mixtral, those `layer_types`
marks `sliding_attention` for Qwen2 and Gemma) by the attention kernels; the KV cache still keeps
every block of a request (freeing blocks that left every layer's window is planned).
`--disable-sliding-window` caps the context at the window and attends to all of it, as in vLLM.

## The transformers fallback

`--model-impl transformers`, and `auto` for an architecture that has no native implementation,
run any decoder-only causal language model that the installed transformers can build and whose
attention goes through transformers' attention interface, with transformers' own modelling code
and this engine's paged KV cache, scheduler and sampler. It runs eagerly (no torch.compile, no
CUDA graphs) and as one pipeline stage (`--pipeline-parallel-size` above 1 is refused). Under
tensor parallelism the linear layers that transformers' `base_model_tp_plan` splits plainly
(`colwise`, `rowwise`) become this engine's parallel layers, each rank reading its slice; layers
of other styles stay replicated (correct, not split); key/value heads must divide by the
tensor-parallel size; an architecture without a plan (gpt-oss) is refused above one rank. Each
layer's sliding window, attention soft-capping and attention sinks go to the kernels, and the final-logit scalings of Granite,
Cohere and Gemma are applied. Tested against transformers, token for token:
{tested}. An architecture neither path can run is refused at startup with the reason.

Image-text-to-text models (`AutoModelForImageTextToText`) run the same way, their vision tower
and projector through transformers' `get_image_features`, on one rank; tested with images
against transformers: `AyaVisionForConditionalGeneration`, and `LlavaForConditionalGeneration`
forced through it. M-RoPE models and those whose images attend both ways are refused
(`docs/multimodal.md`).

gpt-oss runs through the fallback, its attention sinks in the kernels and its experts in
transformers' own code; its MXFP4 checkpoints (`*_blocks`, `*_scales`) are dequantised to the
model dtype at load (an MXFP4 kernel is planned).

LongRoPE (Phi-3): each position takes the short or the long factors by itself; transformers'
Phi-3 recomputes its whole KV cache with the long factors when a sequence crosses
`original_max_position_embeddings`, which a paged engine does not do (nor does vLLM), so tokens
after that point may differ from transformers'.

DeepSeek-V2/V3 keep one latent per token in the KV cache (`kv_lora_rank + qk_rope_head_dim`
values, not per-head keys and values) and attend over it with the key and value up-projections
absorbed; the KV-cache sizing counts the latent. Their multi-token-prediction layer
(`num_nextn_predict_layers`) is skipped at load; `--speculative-config` method `mtp` runs it as a
draft head (`models/deepseek_mtp.py`). V2's routing
follows transformers' (`norm_topk_prob` is not read for V2, as there).

LLaVA (`LlavaForConditionalGeneration`: CLIP vision tower, projector, Llama) takes images in
chat `image_url` parts and offline `multi_modal_data` (`docs/multimodal.md`); tested against
transformers token for token and logprob for logprob, on one rank and across tensor and pipeline
ranks; its vision tower is replicated on the first stage's ranks (small beside the language
model). LLaVA-NeXT (`LlavaNextForConditionalGeneration`) adds anyres tiling: each image is a
base tile and 2 or more grid tiles through the same tower, unpadded, with a learned newline row;
tested against transformers for images of different sizes and aspect ratios, whole and under
chunked prefill. LLaVA-OneVision (`LlavaOnevisionForConditionalGeneration`: a SigLIP tower, a
Qwen2, NeXT's tiling with grids over `anyres_max_N` tiles' worth scaled down) takes images and
videos through a stand-in for its Hugging Face processor (which needs torchvision); tested
against transformers for one image, two, a video and text batched with them, offline and in
chat. Gemma 3
(`Gemma3ForConditionalGeneration`: a SigLIP tower, an average-pooling projector, Gemma 3's text
model) attends bidirectionally within each image's tokens as transformers does, and keeps every
image whole in one prefill chunk; pan-and-scan is off unless `--mm-processor-kwargs` turns it on
(`do_pan_and_scan`); tested against transformers whole, under chunked prefill and preemption,
from a prefix-cache hit that ends inside an image, and across tensor and pipeline ranks.
Qwen2-VL and Qwen2.5-VL (`Qwen2VLForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration`:
the Qwen vision transformer at each image's own resolution, 2.5's with window attention, and a
Qwen2 with M-RoPE) are tested against transformers for images of different sizes, whole, under
chunked prefill and preemption, from prefix-cache hits, and across tensor and pipeline ranks;
their vision tower is replicated on the first stage's ranks. Qwen3-VL
(`Qwen3VLForConditionalGeneration`: a tower with learned position embeddings and DeepStack
rows added to the first decoder layers, a Qwen3 with interleaved M-RoPE) is tested the same
ways, and with offline videos (timestamped frames); Qwen3-VL-MoE
(`Qwen3VLMoeForConditionalGeneration`, its experts through the fused MoE) against transformers
whole, chunked and across ranks. Mistral 3
(`Mistral3ForConditionalGeneration`: the Pixtral tower at each image's own size, block-diagonal
attention between images, a patch merger, Mistral's language model) is tested against
transformers for images of different sizes, whole, under chunked prefill and preemption, and
from prefix-cache hits, and across tensor and pipeline ranks; its vision tower is replicated on
the first stage's ranks. Pixtral-12B's Hugging Face layout (`LlavaForConditionalGeneration` with
a Pixtral tower) runs through the same tower, tested with Mistral 3's cases. Videos for the other
models are planned.

Qwen2-Audio (`Qwen2AudioForConditionalGeneration`: Whisper's encoder layers over each clip's
frames of audio, an average pool, a projector and a Qwen2) takes audio in chat `input_audio` and
`audio_url` parts and offline `multi_modal_data` (`docs/multimodal.md`); tested against
transformers token for token and logprob for logprob for one clip, two, clips between text,
batched with text, under chunked prefill and preemption, from prefix-cache hits, and across
tensor and pipeline ranks; its encoder is replicated on the first stage's ranks.

Whisper (`WhisperForConditionalGeneration`) serves `/v1/audio/transcriptions` and
`/v1/audio/translations` and offline prompts with `multi_modal_data={{"audio": (samples, rate)}}`
(`docs/multimodal.md`): each request's audio is encoded once at its first step and its
cross-attention keys and values are kept with the request; the decoder's self-attention uses the
paged KV cache, the scheduler and the sampler as any model's. Tested against transformers token
for token and logprob for logprob, batched, under chunked prefill and preemption, and from
prefix-cache hits (keyed by the audio). It runs on one rank, eagerly (no CUDA graphs).

Planned: native gpt-oss (CUDA graphs, torch.compile, MXFP4 experts kept packed), expert-parallel load balancing
(`--enable-eplb`), and the fallback across pipeline stages.
"""
