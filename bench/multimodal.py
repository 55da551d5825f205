"""Image + text requests through the offline engine, and where their time goes.

A LLaVA-shaped model with random weights (default: a CLIP tower of 224-pixel images in 14-pixel
patches, 256 feature tokens an image, 4 layers of width 256; a Llama of 4 layers, width 512) and
its processor are written to a temporary folder. ``--num-prompts`` chat-shaped prompts of a few
words and ``--images`` random images each run greedy, EOS ignored, in one ``LLM.generate`` call
after a warm-up. Reported: requests and output tokens per second, and the share of the wall
time spent preprocessing (the Hugging Face processor on the API side), in the vision encoder
(tower and projector, in the model runner) and the rest (the language model's prefill and
decode, scheduling, sampling).
Run: ``python -m bench multimodal`` (``--help`` for sizes).

Measured on the development machine's CPU (shared by other work; defaults, float32, 1 thread;
16 prompts of one image, 275 prompt tokens each, 32 output tokens): 3.0-3.9 requests/s, 95-126
output tokens/s; preprocessing 1.3% of the time, the vision encoder 17%, the rest 82% (two runs).
Not measured on a GPU yet.

``--model gemma3``: the same sizes as a Gemma 3 (a SigLIP tower of 4 layers; a Gemma 3 text
model of 4 layers, sliding and full in turn), also reporting the time its image rows take to
attend again over their whole image. Measured the same way (one run each, one after the other):
256 tokens an image (4,496 prompt tokens), 1.56 requests/s, 49.8 output tokens/s, encoder 14%,
attention within images 2.0%, against LLaVA's 1.76 and 56.5 in the same session; 64 tokens an
image, 2.99 requests/s, attention within images 1.3%.

``--model qwen2_5_vl`` / ``qwen2_vl``: the same widths as Qwen2.5-VL / Qwen2-VL (4 vision layers
of width 256, 2.5's in windows of 112 pixels but the last; a Qwen2 with M-RoPE), each 320 x 240
image scaled to at most 224 x 224 pixels' worth: 63 tokens an image. Measured the same way, one
run each in one session (2025-11-25, the machine shared): 2.69 and 2.72 requests/s, 86 and 87
output tokens/s (1,168 prompt tokens), preprocessing 2.9% and 3.7%, the vision encoder 33% and
31% (a 224-pixel image is 256 patches through the tower, 63 rows out); LLaVA after them, while
tests ran beside it: 0.70 requests/s.

``--model mistral3``: the same widths as Mistral 3 (a Pixtral tower of 4 layers of width 256 in
14-pixel patches, 2 x 2 merged; a Mistral of 4 layers), each 320 x 240 image resized to fit 224
pixels (224 x 168: 8 x 6 merged patches, 54 tokens with the row breaks). Measured the same way
(2026-11-26, the machine shared), two runs: 3.64 and 2.77 requests/s (116.6, 88.5 output tokens/s;
1,168 prompt tokens), preprocessing 2.5-2.6%, the vision encoder 33-35%; Qwen2.5-VL between
them: 2.64 requests/s, encoder 33%.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench multimodal", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model",
        choices=["llava", "gemma3", "qwen2_vl", "qwen2_5_vl", "mistral3"],
        default="llava",
        help="gemma3: a SigLIP tower pooled to --gemma3-tokens tokens an image, image tokens "
        "attending to their whole image; qwen2_vl, qwen2_5_vl: each image at its own "
        "resolution up to --image-size squared pixels, one token per 2 x 2 patches, M-RoPE "
        "(2.5: window attention, the last vision layer full); mistral3: the Pixtral tower, "
        "each image at its own size within --image-size pixels' longest edge, 2 x 2 patches "
        "merged, a row of tokens ended by [IMG_BREAK]",
    )
    parser.add_argument("--gemma3-tokens", type=int, default=64, help="feature tokens an image")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--images", type=int, default=1, help="images per prompt")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--patch-size", type=int, default=14)
    parser.add_argument("--vision-layers", type=int, default=4)
    parser.add_argument("--vision-hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def _write_model(folder: str, args: argparse.Namespace) -> str:
    from infernetes.runtime.testing_vision import (
        make_tiny_gemma3,
        make_tiny_llava,
        make_tiny_mistral3,
        make_tiny_qwen2_vl,
    )

    vision = dict(
        hidden_size=args.vision_hidden,
        intermediate_size=4 * args.vision_hidden,
        num_hidden_layers=args.vision_layers + 1,  # LLaVA reads the second to last
        num_attention_heads=max(args.vision_hidden // 64, 1),
    )
    text = dict(
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(args.hidden // 64, 1),
        num_key_value_heads=max(args.hidden // 128, 1),
        max_position_embeddings=8192,
    )
    if args.model in ("qwen2_vl", "qwen2_5_vl"):
        heads = vision["num_attention_heads"]
        qwen_vision = dict(depth=args.vision_layers, num_heads=heads)
        if args.model == "qwen2_vl":
            qwen_vision.update(embed_dim=args.vision_hidden, mlp_ratio=4)
        else:  # windows of 112 pixels (the released models'), the last layer full
            qwen_vision.update(
                hidden_size=args.vision_hidden,
                intermediate_size=vision["intermediate_size"],
                window_size=112,
                fullatt_block_indexes=[args.vision_layers - 1],
            )
        return str(
            make_tiny_qwen2_vl(
                Path(folder) / args.model,
                version="2" if args.model == "qwen2_vl" else "2.5",
                dtype=args.dtype,
                patch_size=args.patch_size,
                max_pixels=args.image_size**2,
                vision=qwen_vision,
                text=text,
            )
        )
    if args.model == "mistral3":
        vision["num_hidden_layers"] = args.vision_layers  # Mistral 3 reads the last
        return str(
            make_tiny_mistral3(
                Path(folder) / "mistral3",
                dtype=args.dtype,
                patch_size=args.patch_size,
                longest_edge=args.image_size,
                vision={**vision, "image_size": args.image_size, "patch_size": args.patch_size},
                text=text,
            )
        )
    if args.model == "gemma3":
        vision["num_hidden_layers"] = args.vision_layers  # Gemma 3 reads the last
        path = make_tiny_gemma3(
            Path(folder) / "gemma3",
            dtype=args.dtype,
            image_size=args.image_size,
            patch_size=args.patch_size,
            tokens_per_image=args.gemma3_tokens,
            sliding_window=512,
            vision=vision,
            text=text,
        )
    else:
        path = make_tiny_llava(
            Path(folder) / "llava",
            dtype=args.dtype,
            image_size=args.image_size,
            patch_size=args.patch_size,
            vision=vision,
            text=text,
        )
    return str(path)


class _Clock:
    """Seconds spent in a wrapped callable."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def main(argv: list[str]) -> int:
    import torch
    from infernetes.runtime.testing_vision import random_image

    from infernetes import LLM, SamplingParams

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="infernetes-bench-multimodal-") as folder:
        path = _write_model(folder, args)
        llm = LLM(path, dtype=args.dtype, device=args.device, max_model_len=4096)
        engine = llm.llm_engine
        preprocess, encoder = _Clock(), _Clock()
        processor = engine.input_processor.mm_processor
        processor.process = preprocess.wrap(processor.process)
        model = engine.engine_core.executor.driver_worker.model_runner.model
        device = next(model.parameters()).device
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        embed = model.embed_multimodal

        def encode_and_wait(modality, data):
            out = embed(modality, data)
            sync()  # the encoder's time, not the launch's
            return out

        model.embed_multimodal = encoder.wrap(encode_and_wait)
        from infernetes.kernels import ops

        within_images = _Clock()  # Gemma 3's image rows attended again over their whole image
        ops.attend_within_images = within_images.wrap(ops.attend_within_images)
        params = SamplingParams(
            temperature=0.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False
        )
        placeholder = processor.image_token
        text = "Describe " + " and ".join([placeholder] * args.images) + " in a few words."

        def prompts(offset: int) -> list[dict]:
            return [
                {
                    "prompt": text,
                    "multi_modal_data": {
                        "image": [
                            random_image(offset + i * args.images + k, (320, 240))
                            for k in range(args.images)
                        ]
                    },
                }
                for i in range(args.num_prompts)
            ]

        llm.generate(prompts(10_000)[:2], params)  # warm-up
        batch = prompts(0)  # the images are made before the clock starts
        preprocess.seconds = encoder.seconds = within_images.seconds = 0.0
        start = time.perf_counter()
        outputs = llm.generate(batch, params)
        wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    rest = wall - preprocess.seconds - encoder.seconds
    print(
        f"{args.model}: {args.num_prompts} prompts x {args.images} image(s) of {args.image_size} px "
        f"({prompt_tokens} prompt tokens), {args.output_len} output tokens each, "
        f"on {device.type}, {args.dtype}, {args.threads} thread(s)"
    )
    print(f"  {args.num_prompts / wall:.2f} requests/s, {tokens / wall:.1f} output tokens/s")
    shares = [
        ("preprocessing (HF processor)", preprocess.seconds),
        ("vision encoder", encoder.seconds),
        ("language model and the rest", rest),
    ]
    if args.model == "gemma3":
        shares.append(("  of which attention in images", within_images.seconds))
    for name, seconds in shares:
        print(f"  {name:30s} {seconds:7.2f} s  {100 * seconds / wall:5.1f}%")
    return 0
