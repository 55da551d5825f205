"""Tiny vision-language models for tests: a random LLaVA (CLIP vision tower, projector, Llama)
saved with its processor (CLIP's image processor and the tokenizer of ``testing.py`` with an
``<image>`` token), and transformers' greedy continuation as the reference. Nothing is
downloaded."""

from __future__ import annotations

import functools
import inspect
import io
from pathlib import Path
from typing import Any

from infernetes.runtime.testing import build_tokenizer

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 32
PATCH_SIZE = 8  # 16 patches: 16 feature tokens per image (the CLS token dropped)

# Renders content given as a string or as OpenAI-style parts, an image part as its placeholder
# (the shape of llava-hf's own templates).
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% else %}{{ '<image>' }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_tiny_llava(
    directory: str | Path,
    *,
    seed: int = 0,
    dtype: str = "float32",
    image_size: int = IMAGE_SIZE,
    patch_size: int = PATCH_SIZE,
    vision: dict[str, Any] | None = None,
    text: dict[str, Any] | None = None,
) -> Path:
    """Write a random ``LlavaForConditionalGeneration`` and its ``LlavaProcessor``: tiny by
    default; ``vision`` and ``text`` override the CLIP and Llama configs (benchmarks)."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(
        directory, extra_special_tokens=[IMAGE_TOKEN], chat_template=LLAVA_CHAT_TEMPLATE
    )
    vision_config, text_config = _configs(tokenizer, image_size, patch_size, vision, text)
    config = transformers.LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(image_size // patch_size) ** 2,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config).to(getattr(torch, dtype)).eval()
    _spread_projector(model)
    model.save_pretrained(str(directory))
    image_processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
    )
    processor = transformers.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(directory))
    return directory


# Tilings (height, width) in multiples of the tower's input: an image gets 2 to 5 tiles
GRID_PINPOINTS = [[32, 64], [64, 32], [64, 64], [32, 96]]


def make_tiny_llava_next(directory: str | Path, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a random ``LlavaNextForConditionalGeneration`` (anyres tiling over
    ``GRID_PINPOINTS``) and its ``LlavaNextProcessor``."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(
        directory, extra_special_tokens=[IMAGE_TOKEN], chat_template=LLAVA_CHAT_TEMPLATE
    )
    vision_config, text_config = _configs(tokenizer, IMAGE_SIZE, PATCH_SIZE, None, None)
    config = transformers.LlavaNextConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_grid_pinpoints=GRID_PINPOINTS,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    config.architectures = ["LlavaNextForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.LlavaNextForConditionalGeneration(config).to(getattr(torch, dtype))
    _spread_projector(model.eval())
    with torch.no_grad():
        model.model.image_newline.normal_(0.0, 1.0)
    model.save_pretrained(str(directory))
    image_processor = transformers.LlavaNextImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=GRID_PINPOINTS,
    )
    processor = transformers.LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(directory))
    return directory


VIDEO_TOKEN = "<video>"
# LLaVA-OneVision's templates write a video part as <video>
ONEVISION_CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE.replace(
    "{% else %}{{ '<image>' }}",
    "{% elif part['type'] == 'video' %}{{ '<video>' }}{% else %}{{ '<image>' }}",
)


def make_tiny_llava_onevision(
    directory: str | Path, *, seed: int = 0, dtype: str = "float32", max_tiles: int = 2
) -> Path:
    """Write a random ``LlavaOnevisionForConditionalGeneration`` (a SigLIP tower, a Qwen2 LM,
    anyres tiling over ``GRID_PINPOINTS``; grids over ``max_tiles`` tiles' worth scaled down),
    its image processor and tokenizer."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(
        directory,
        extra_special_tokens=[IMAGE_TOKEN, VIDEO_TOKEN],
        chat_template=ONEVISION_CHAT_TEMPLATE,
    )
    clip_config, llama_config = _configs(tokenizer, IMAGE_SIZE, PATCH_SIZE, None, None)
    vision_config = _siglip_config(clip_config)
    text_config = transformers.Qwen2Config(**llama_config.to_diff_dict())
    aspect_ratio = f"anyres_max_{max_tiles}"
    config = transformers.LlavaOnevisionConfig(
        vision_config=vision_config.to_dict(),
        text_config=text_config.to_dict(),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        video_token_index=tokenizer.convert_tokens_to_ids(VIDEO_TOKEN),
        image_grid_pinpoints=GRID_PINPOINTS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio=aspect_ratio,
    )
    config.architectures = ["LlavaOnevisionForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.LlavaOnevisionForConditionalGeneration(config).to(getattr(torch, dtype))
    _spread_projector(model.eval())
    with torch.no_grad():
        model.model.image_newline.normal_(0.0, 1.0)
    model.save_pretrained(str(directory))
    # Its LlavaOnevisionProcessor cannot be built without torchvision (transformers resolves
    # the video processor's class at construction): the image processor and tokenizer only,
    # which the served stand-in (multimodal/llava_onevision.py) reads.
    image_processor = transformers.LlavaOnevisionImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_grid_pinpoints=GRID_PINPOINTS
    )
    image_processor.save_pretrained(str(directory))
    return directory


GEMMA3_BOI, GEMMA3_EOI, GEMMA3_SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
GEMMA3_TOKENS_PER_IMAGE = 4  # the 4 x 4 patches pooled 2 x 2
GEMMA3_SLIDING_WINDOW = 3  # under an image's length: the window and the image rules meet
# Gemma 3's own templates render an image part as <start_of_image>
GEMMA3_CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE.replace("'<image>'", f"'{GEMMA3_BOI}'")


def make_tiny_gemma3(
    directory: str | Path,
    *,
    seed: int = 0,
    dtype: str = "float32",
    image_size: int = IMAGE_SIZE,
    patch_size: int = PATCH_SIZE,
    tokens_per_image: int = GEMMA3_TOKENS_PER_IMAGE,
    sliding_window: int = GEMMA3_SLIDING_WINDOW,
    vision: dict[str, Any] | None = None,
    text: dict[str, Any] | None = None,
) -> Path:
    """Write a random ``Gemma3ForConditionalGeneration`` (a SigLIP tower, a Gemma 3 text model
    of sliding and full layers, 4 feature tokens per image) and its ``Gemma3Processor`` (the
    PIL image processor: no torchvision): tiny by default; the rest override it (benchmarks)."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer(
        directory,
        extra_special_tokens=[GEMMA3_BOI, GEMMA3_EOI, GEMMA3_SOFT],
        chat_template=GEMMA3_CHAT_TEMPLATE,
    )
    # the processor finds its tokens by these names on the tokenizer
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(
        str(directory),
        extra_special_tokens={
            "boi_token": GEMMA3_BOI,
            "eoi_token": GEMMA3_EOI,
            "image_token": GEMMA3_SOFT,
        },
    )
    clip_config, llama_config = _configs(tokenizer, image_size, patch_size, vision, text)
    vision_config = _siglip_config(clip_config)
    text_config = transformers.Gemma3TextConfig(
        **_text_settings(llama_config),
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=sliding_window,
        layer_types=[
            "full_attention" if i % 2 else "sliding_attention"
            for i in range(llama_config.num_hidden_layers)
        ],
        # local and global layers with rope bases of their own
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    config = transformers.Gemma3Config(
        vision_config=vision_config.to_dict(),
        text_config=text_config.to_dict(),
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=tokenizer.convert_tokens_to_ids(GEMMA3_BOI),
        eoi_token_index=tokenizer.convert_tokens_to_ids(GEMMA3_EOI),
        image_token_index=tokenizer.convert_tokens_to_ids(GEMMA3_SOFT),
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).to(getattr(torch, dtype)).eval()
    with torch.no_grad():  # both start at zero: make images move the logits
        projector = model.model.multi_modal_projector
        projector.mm_input_projection_weight.normal_(0.0, 0.5)
        projector.mm_soft_emb_norm.weight.normal_(0.0, 0.5)
    model.save_pretrained(str(directory))
    image_processor = transformers.Gemma3ImageProcessorPil(
        size={"height": image_size, "width": image_size}
    )
    processor = transformers.Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=tokens_per_image,
        chat_template=GEMMA3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(directory))
    return directory


QWEN_VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # an image's place in a Qwen prompt
QWEN_PATCH, QWEN_MERGE = 8, 2  # so image sides are multiples of 16 pixels
QWEN_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"  # a video's place in a Qwen prompt
QWEN_CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE.replace(
    "{% else %}{{ '<image>' }}",
    f"{{% elif part['type'] == 'video' %}}{{{{ '{QWEN_VIDEO}' }}}}{{% else %}}{{{{ '{QWEN_IMAGE}' }}}}",
)


def make_tiny_qwen2_vl(
    directory: str | Path,
    *,
    version: str = "2",
    seed: int = 0,
    dtype: str = "float32",
    patch_size: int = QWEN_PATCH,
    max_pixels: int = 9216,
    vision: dict[str, Any] | None = None,
    text: dict[str, Any] | None = None,
) -> Path:
    """Write a random ``Qwen2VLForConditionalGeneration`` (``version`` "2"),
    ``Qwen2_5_VLForConditionalGeneration`` ("2.5": window attention over 2 x 2 merge blocks,
    the last of three blocks full), ``Qwen3VLForConditionalGeneration`` ("3": a 4 x 4 grid of
    learned position embeddings, DeepStack from tower blocks 0 and 1 into three Qwen3 decoder
    layers, interleaved M-RoPE) or ``Qwen3VLMoeForConditionalGeneration`` ("3-moe": the same
    with experts), M-RoPE over sections [2, 3, 3] of a 16-wide head (the
    released models' proportions), and its image processor (the PIL one: images of 256 to
    ``max_pixels`` pixels) and tokenizer: tiny by default; ``vision`` and ``text`` override
    the configs (benchmarks)."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(
        directory, extra_special_tokens=QWEN_VISION_TOKENS, chat_template=QWEN_CHAT_TEMPLATE
    )
    ids = dict(
        zip(QWEN_VISION_TOKENS, tokenizer.convert_tokens_to_ids(QWEN_VISION_TOKENS), strict=True)
    )
    _, llama = _configs(tokenizer, IMAGE_SIZE, PATCH_SIZE, None, text)
    text_config = _text_settings(llama)
    eighth = llama.hidden_size // llama.num_attention_heads // 8
    text_config["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [eighth, 3 * eighth // 2, 3 * eighth // 2],
    }
    vision_config: dict[str, Any] = dict(
        depth=3,
        num_heads=4,
        patch_size=patch_size,
        spatial_merge_size=QWEN_MERGE,
        temporal_patch_size=2,
        in_channels=3,
        initializer_range=0.1,
    )
    config_class: Any
    if version in ("3", "3-moe"):
        config_class, model_name = transformers.Qwen3VLConfig, "Qwen3VLForConditionalGeneration"
        text_config.update(num_hidden_layers=3, head_dim=text_config["hidden_size"] // 4)
        if version == "3-moe":  # 4 experts of 48, 2 a token (not 32: 2 x 32 would be square)
            config_class = transformers.Qwen3VLMoeConfig
            model_name = "Qwen3VLMoeForConditionalGeneration"
            text_config.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
        text_config["rope_parameters"]["mrope_interleaved"] = True
        vision_config.update(
            hidden_size=32,
            out_hidden_size=llama.hidden_size,
            intermediate_size=48,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0, 1],
        )
    elif version == "2":
        config_class, model_name = transformers.Qwen2VLConfig, "Qwen2VLForConditionalGeneration"
        vision_config.update(embed_dim=32, hidden_size=llama.hidden_size, mlp_ratio=2)
    else:
        config_class, model_name = (
            transformers.Qwen2_5_VLConfig,
            "Qwen2_5_VLForConditionalGeneration",
        )
        vision_config.update(
            hidden_size=32,
            out_hidden_size=llama.hidden_size,
            intermediate_size=48,
            window_size=2 * QWEN_MERGE * patch_size,
            fullatt_block_indexes=[2],
            hidden_act="silu",
        )
    config = config_class(
        text_config=text_config,
        vision_config={**vision_config, **(vision or {})},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    config.architectures = [model_name]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(getattr(torch, dtype)).eval()
    with torch.no_grad():  # make images move the logits
        mergers = [
            model.model.visual.merger,
            *getattr(model.model.visual, "deepstack_merger_list", []),
        ]
        for parameter in (p for merger in mergers for p in merger.parameters()):
            parameter.normal_(0.0, 0.5)
    model.save_pretrained(str(directory))
    transformers.Qwen2VLImageProcessorPil(
        min_pixels=256,
        max_pixels=max_pixels,
        patch_size=patch_size,
        merge_size=QWEN_MERGE,
        temporal_patch_size=2,
    ).save_pretrained(str(directory))
    return directory


PIXTRAL_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
PIXTRAL_PATCH, PIXTRAL_MERGE = 4, 2  # so image sides are multiples of 8 pixels
PIXTRAL_LONGEST_EDGE = 48  # at most 6 x 6 merged patches
PIXTRAL_CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE.replace("'<image>'", "'[IMG]'")


def make_tiny_mistral3(
    directory: str | Path,
    *,
    seed: int = 0,
    dtype: str = "float32",
    patch_size: int = PIXTRAL_PATCH,
    longest_edge: int = PIXTRAL_LONGEST_EDGE,
    feature_layer: int = -1,
    vision: dict[str, Any] | None = None,
    text: dict[str, Any] | None = None,
) -> Path:
    """Write a random ``Mistral3ForConditionalGeneration`` (a Pixtral tower of ``patch_size``
    pixel patches, 2 x 2 of them merged, a Mistral language model), its PIL image processor
    (images fit into ``longest_edge`` pixels), its tokenizer with Pixtral's image tokens and the
    ``processor_config.json`` transformers' ``PixtralProcessor`` writes: tiny by default, the
    last tower layer read; the rest override it (benchmarks, other layers)."""
    import json

    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(
        directory, extra_special_tokens=PIXTRAL_TOKENS, chat_template=PIXTRAL_CHAT_TEMPLATE
    )
    _, llama = _configs(tokenizer, IMAGE_SIZE, PATCH_SIZE, None, text)
    text_config = transformers.MistralConfig(**llama.to_diff_dict(), sliding_window=None)
    vision_config = transformers.PixtralVisionConfig(
        **{
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 2,  # a 16-wide head: 4 frequencies each for rows and columns
            "image_size": longest_edge,
            "patch_size": patch_size,
            "hidden_act": "silu",
            "initializer_range": 0.1,
            **(vision or {}),
        }
    )
    config = transformers.Mistral3Config(
        vision_config=vision_config.to_dict(),
        text_config=text_config.to_dict(),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=PIXTRAL_MERGE,
        vision_feature_layer=feature_layer,
        multimodal_projector_bias=False,
        projector_hidden_act="gelu",
        tie_word_embeddings=False,  # as the released models (the default ties them)
    )
    config.architectures = ["Mistral3ForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.Mistral3ForConditionalGeneration(config).to(getattr(torch, dtype))
    _spread_projector(model.eval())
    model.save_pretrained(str(directory))
    transformers.PixtralImageProcessorPil(
        size={"longest_edge": longest_edge},
        patch_size={"height": patch_size, "width": patch_size},
    ).save_pretrained(str(directory))
    settings = {
        "processor_class": "PixtralProcessor",
        "patch_size": patch_size,
        "spatial_merge_size": PIXTRAL_MERGE,
        "image_token": "[IMG]",
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
    }
    (directory / "processor_config.json").write_text(json.dumps(settings, indent=2))
    return directory


def make_tiny_pixtral(directory: str | Path, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a random ``LlavaForConditionalGeneration`` with a Pixtral tower (Pixtral-12B's
    layout: no merging, so 8-pixel patches make ``make_tiny_mistral3``'s grids), its image
    processor, tokenizer and ``processor_config.json``."""
    import json

    import torch
    import transformers

    directory = Path(directory)
    unit = PIXTRAL_PATCH * PIXTRAL_MERGE
    mistral3 = transformers.AutoConfig.from_pretrained(
        make_tiny_mistral3(directory, seed=seed, dtype=dtype)
    )
    vision = mistral3.vision_config.to_dict() | {"patch_size": unit}
    config = transformers.LlavaConfig(
        vision_config=transformers.PixtralVisionConfig(**vision).to_dict(),
        text_config=mistral3.text_config.to_dict(),
        image_token_index=mistral3.image_token_index,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config).to(getattr(torch, dtype)).eval()
    _spread_projector(model)
    for stale in directory.glob("model*.safetensors*"):
        stale.unlink()
    model.save_pretrained(str(directory))
    transformers.PixtralImageProcessorPil(
        size={"longest_edge": PIXTRAL_LONGEST_EDGE}, patch_size={"height": unit, "width": unit}
    ).save_pretrained(str(directory))
    settings = json.loads((directory / "processor_config.json").read_text())
    settings.update(patch_size=unit, spatial_merge_size=1)
    (directory / "processor_config.json").write_text(json.dumps(settings, indent=2))
    return directory


def png_data_url(image: Any) -> str:
    """A ``data:image/png;base64,`` URI of a PIL image (a chat ``image_url`` part's)."""
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def record_chunk_ends(llm: Any) -> list[tuple[list, int]]:
    """From now on, each scheduled chunk of ``llm``'s engine as its request's multimodal items
    and where the chunk ends (so a test sees whether chunks cut an image)."""
    scheduler = llm.llm_engine.engine_core.scheduler
    ends: list[tuple[list, int]] = []
    schedule = scheduler.schedule

    def recorded() -> Any:
        output = schedule()
        for request_id, num_new in zip(
            output.request_ids, output.num_scheduled_tokens, strict=True
        ):
            request = scheduler.requests[request_id]
            ends.append((request.mm_features, request.num_computed_tokens + num_new))
        return output

    scheduler.schedule = recorded
    return ends


def random_image(seed: int, size: tuple[int, int] = (40, 36)) -> Any:
    """A PIL RGB image of random pixels (not square, so the processor resizes and crops)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


@functools.cache
def _hf_llava(path: str) -> Any:
    import torch
    import transformers

    [architecture] = transformers.AutoConfig.from_pretrained(path).architectures
    model_class = getattr(transformers, architecture)  # LLaVA, LLaVA-NeXT or Gemma 3
    return model_class.from_pretrained(path, dtype=torch.float32).eval()


@functools.cache
def hf_processor(path: str) -> Any:
    """The model's processor as the engine loads it: the model's stand-in where transformers'
    needs torchvision (Qwen2-VL's, Pixtral's), else transformers' own."""
    import transformers
    from infernetes.runtime.model_executor.models import model_class

    config = transformers.AutoConfig.from_pretrained(path)
    _, cls = model_class(config.architectures)
    stand_in = cls.processor_class(config)  # type: ignore[attr-defined]  # a vision-language model's
    return (stand_in or transformers.AutoProcessor).from_pretrained(path)


def hf_llava_greedy(
    path: str | Path,
    prompt: str,
    images: list[Any],
    max_tokens: int,
    videos: list[list[Any]] | None = None,
    audio: list[Any] | None = None,
    **processor_kwargs: Any,
) -> tuple[list[int], list[int], list[float]]:
    """Transformers' greedy continuation of ``prompt`` with ``images`` (one ``<image>`` each),
    ``videos`` (Qwen2-VL: each a list of frames) and ``audio`` (Qwen2-Audio: clips at 16 kHz)
    in float32, EOS ignored: the prompt's expanded ids, the new tokens and each one's logprob."""
    import torch

    processor = hf_processor(str(path))
    with_videos: dict[str, Any] = {"videos": videos} if videos else {}
    if audio:
        with_videos = {"audio": audio, "sampling_rate": 16000}
    inputs = processor(
        text=prompt, images=images or None, return_tensors="pt", **with_videos, **processor_kwargs
    )
    inputs = {name: torch.as_tensor(value) for name, value in inputs.items()}
    if "image_grid_thw" in inputs or "video_grid_thw" in inputs:
        # Qwen2-VL: which tokens are an image's (1) and a video's (2), for its M-RoPE
        ids = inputs["input_ids"]
        video_token = processor.tokenizer.convert_tokens_to_ids(processor.video_token)
        inputs["mm_token_type_ids"] = (ids == processor.image_token_ids[0]).int() + 2 * (
            ids == video_token
        ).int()
    model = _hf_llava(str(path))
    if "second_per_grid_ts" not in inspect.signature(model.forward).parameters:
        inputs.pop("second_per_grid_ts", None)  # Qwen2-VL: a video's frames one position apart
    with torch.inference_mode():
        out = model.generate(
            **inputs,
            eos_token_id=[],
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    prompt_ids = inputs["input_ids"][0].tolist()
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    logprobs = [
        torch.log_softmax(scores[0].float(), -1)[token].item()
        for scores, token in zip(out.scores, tokens, strict=True)
    ]
    return prompt_ids, tokens, logprobs


def assert_equals_transformers(
    outputs: list[Any], expected: list[tuple[list[int], list[int], list[float]]]
) -> None:
    """Each ``RequestOutput``'s prompt ids, greedy tokens and their logprobs (``logprobs=0``)
    equal ``hf_llava_greedy``'s, the logprobs within 1e-4."""
    import math

    for output, (prompt_ids, tokens, logprobs) in zip(outputs, expected, strict=True):
        completion = output.outputs[0]
        served = [
            entry[token].logprob
            for entry, token in zip(completion.logprobs, completion.token_ids, strict=True)
        ]
        assert output.prompt_token_ids == prompt_ids
        assert completion.token_ids == tokens
        assert all(
            math.isclose(a, b, abs_tol=1e-4) for a, b in zip(served, logprobs, strict=True)
        ), f"logprobs {served} != transformers' {logprobs}"


def _configs(
    tokenizer: Any,
    image_size: int,
    patch_size: int,
    vision: dict[str, Any] | None,
    text: dict[str, Any] | None,
) -> tuple[Any, Any]:
    """The tiny CLIP vision and Llama text configs (``vision`` and ``text`` override them)."""
    import transformers

    vision_config = transformers.CLIPVisionConfig(
        **{
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "image_size": image_size,
            "patch_size": patch_size,
            "projection_dim": 32,
            "initializer_range": 0.1,
            **(vision or {}),
        }
    )
    text_config = transformers.LlamaConfig(
        **{
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "tie_word_embeddings": False,
            "initializer_range": 0.1,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **(text or {}),
        }
    )
    return vision_config, text_config


def _siglip_config(clip_config: Any, **settings: Any) -> Any:
    """A SigLIP tower of the tiny CLIP tower's sizes, image and patch."""
    import transformers

    keys = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "image_size",
        "patch_size",
    )
    return transformers.SiglipVisionConfig(
        **{key: getattr(clip_config, key) for key in keys}, **settings
    )


def _text_settings(llama_config: Any) -> dict[str, Any]:
    """The tiny Llama's sizes, token ids and initialisation, for another family's text config."""
    keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "initializer_range",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    )
    return {key: getattr(llama_config, key) for key in keys}


def _spread_projector(model: Any) -> None:
    """The projector starts near zero: make images move the logits."""
    import torch

    with torch.no_grad():
        for parameter in model.model.multi_modal_projector.parameters():
            parameter.normal_(0.0, 0.5)


AYA_TOKENS = [
    "<|START_OF_IMG|>",
    "<|END_OF_IMG|>",
    "<|IMG_PATCH|>",
    "<|IMG_LINE_BREAK|>",
    "TILE",
    "TILE_GLOBAL",
]
AYA_PATCH, AYA_DOWNSAMPLE = 4, 2  # 8 x 8 patches of a 32-pixel tile, shuffled to 16 tokens


def make_tiny_aya_vision(
    directory: str | Path, *, seed: int = 0, dtype: str = "float32", crop_to_patches: bool = False
) -> Path:
    """Write a random ``AyaVisionForConditionalGeneration`` (a SigLIP tower, a pixel-shuffle
    SwiGLU projector, a Cohere 2 language model of sliding and full layers; no native
    implementation here) and its ``AyaVisionProcessor`` (the PIL image processor): an image is
    its begin token, a global-tile mark, 16 patch tokens and its end token, or with
    ``crop_to_patches`` a run of tiles before them."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(
        directory,
        extra_special_tokens=[IMAGE_TOKEN, *AYA_TOKENS],
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    clip_config, llama = _configs(tokenizer, IMAGE_SIZE, AYA_PATCH, None, None)
    vision_config = _siglip_config(clip_config, vision_use_head=False)
    text_config = transformers.Cohere2Config(
        **{**_text_settings(llama), "num_hidden_layers": 3},
        sliding_window=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        logit_scale=0.5,
    )
    config = transformers.AyaVisionConfig(
        vision_config=vision_config.to_dict(),
        text_config=text_config.to_dict(),
        downsample_factor=AYA_DOWNSAMPLE,
        image_token_index=tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"),
        tie_word_embeddings=False,
    )
    config.architectures = ["AyaVisionForConditionalGeneration"]
    config.dtype = dtype
    torch.manual_seed(seed)
    model = transformers.AyaVisionForConditionalGeneration(config).to(getattr(torch, dtype))
    _spread_projector(model.eval())
    model.save_pretrained(str(directory))
    image_processor = transformers.GotOcr2ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        crop_to_patches=crop_to_patches,
        max_patches=4,
    )
    processor = transformers.AyaVisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=AYA_PATCH,
        img_size=IMAGE_SIZE,
        downsample_factor=AYA_DOWNSAMPLE,
        image_token=IMAGE_TOKEN,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(directory))
    return directory


# the colours of make_video's frames, in turn
COLOURS = [(220, 30, 30), (30, 200, 40), (40, 60, 210), (230, 220, 40), (20, 20, 20)]


def make_video(frames: int, fps: int, size: tuple[int, int] = (48, 32), fmt: str = "mp4") -> bytes:
    """An encoded video of ``frames`` frames, each one colour of COLOURS in turn (a corner of
    each inverted)."""
    import av
    import numpy as np

    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for i in range(frames):
            pixels = np.full((size[1], size[0], 3), COLOURS[i % len(COLOURS)], np.uint8)
            pixels[: size[1] // 2, : size[0] // 2] = 255 - pixels[0, 0]  # not one flat colour
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        if frames:
            container.mux(stream.encode())
        else:  # a header and no frame (an encoder flushed unused writes none)
            container.start_encoding()
    return buffer.getvalue()


def decoded_frames(data: bytes, indices: list[int]) -> list:
    """The frames at ``indices`` as PyAV decodes them (the lossy codec's pixels)."""
    import av

    with av.open(io.BytesIO(data), "r") as container:
        frames = [frame.to_image() for frame in container.decode(video=0)]
    return [frames[i] for i in indices]
